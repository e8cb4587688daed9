"""The evaluation report's explained mistakes (`vit-ft evaluate --explain METHOD`, `tools.explain.mistakes`): the
mistakes chosen are the most confident ones, ranked here from the report's own predictions.csv (single-label:
predicted and true class; multi-label: the false positives with the highest and the false negatives with the
lowest probability, the wrong label), at most MAX_EXPLAINED whatever the data's size; their maps are
`explain`'s for those classes; the figure is in report.md and metrics.json; and each bad input is one `error:`
line before anything is written (a class-agnostic or unknown method, an ONNX export, from evaluate and predict).
Tiny models (hidden 32, 2 layers, 16x16) on generated folders."""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.commands import evaluate as evaluate_command
from vit_ft.metrics.multilabel import MULTI_LABEL
from vit_ft.tools.evaluate.data import folder_eval_data
from vit_ft.tools.evaluate.outputs import predict_dataset
from vit_ft.tools.evaluate.run import run_evaluation
from vit_ft.tools.explain.methods import explain
from vit_ft.tools.explain.mistakes import (
    MAX_EXPLAINED,
    MISTAKES_FIGURE,
    check_report_method,
    mistake_maps,
    select_mistakes,
)
from vit_ft.tools.explain.names import REPORT_METHOD
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import save_tiny_classifier, tiny_ft_config

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

NAMES = ["ant", "bee", "wasp"]



def _image(path: Path, rng: np.random.Generator) -> None:
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """A single-label model and 18 random images in class folders: a random model gets most of them wrong, more
    than MAX_EXPLAINED."""
    root = tmp_path_factory.mktemp("explain_report")
    rng = np.random.default_rng(0)
    for index in range(18):
        (root / "data" / NAMES[index % 3]).mkdir(parents=True, exist_ok=True)
        _image(root / "data" / NAMES[index % 3] / f"{index:02d}.png", rng)
    model = save_tiny_classifier(root / "model", NAMES, seed=3)
    # the command, without --explain: its default (gradcam) draws the grid
    args = ["--model", model, "--output_dir", root / "report", "--data_dir", root / "data", "--bf16", "false"]
    result = run_script("scripts/evaluate_model.py", args, None, cwd=root)
    assert result.returncode == 0, result.stderr[-4000:]
    return model, root / "data", root / "report", json.loads((root / "report" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """A multi-label model and 16 images with 0-2 labels each in labels.csv; each label's decision threshold is its
    median probability on them, so that both kinds of mistake are there."""
    root = tmp_path_factory.mktemp("explain_report_ml")
    rng = np.random.default_rng(1)
    (root / "data").mkdir()
    rows = ["file,labels"]
    for index in range(16):
        _image(root / "data" / f"{index:02d}.png", rng)
        rows.append(f"{index:02d}.png,{';'.join(rng.choice(NAMES, index % 3, replace=False))}")
    (root / "data" / "labels.csv").write_text("\n".join(rows) + "\n")
    model = save_tiny_classifier(root / "model", NAMES, seed=5, problem_type=MULTI_LABEL)
    trained = load_trained(model, device="cpu")
    pixels = torch.stack([trained.transform.transform_image(str(f)) for f in sorted((root / "data").glob("*.png"))])
    config = json.loads((model / "config.json").read_text())
    config["decision_threshold"] = trained.probabilities(pixels).median(dim=0).values.tolist()
    (model / "config.json").write_text(json.dumps(config))
    metrics = run_evaluation(model, root / "report", data_dir=root / "data", progress=False, device="cpu",
                             explain="gradcam")  # fmt: skip
    return model, root / "data", root / "report", metrics


def _outputs(model: Path, data: Path):
    trained = load_trained(model, device="cpu")
    evaluated = folder_eval_data(data, trained.id2label, multi_label=trained.task.problem_type == MULTI_LABEL)
    return trained, evaluated, predict_dataset(trained, evaluated, progress=False)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_single_label_explains_the_most_confident_mistakes_for_both_classes(single):
    model, data, report, metrics = single
    wrong = [row for row in _rows(report / "predictions.csv") if row["correct"] == "False"]
    assert len(wrong) > MAX_EXPLAINED  # so that the bound is what is tested
    expected = sorted(wrong, key=lambda row: -float(row["probability"]))[:MAX_EXPLAINED]
    trained, evaluated, outputs = _outputs(model, data)
    chosen = select_mistakes(outputs, trained.id2label)
    assert [m.row for m in chosen] == [int(row["row"]) for row in expected]
    assert [tuple(NAMES[c] for c, _ in m.targets) for m in chosen] == [
        (row["predicted_label"], row["true_label"]) for row in expected
    ]
    assert metrics["explained_mistakes"] == {"method": "gradcam", "mistakes": MAX_EXPLAINED, "figure": MISTAKES_FIGURE}
    assert f"![explained mistakes]({MISTAKES_FIGURE})" in (report / "report.md").read_text()
    with Image.open(report / MISTAKES_FIGURE) as figure:
        assert figure.format == "PNG" and figure.size[0] > 600  # 6 panels a row
    first = evaluated.dataset[chosen[0].row]["image"]
    pixels = trained.transform.transform_image(first)[None]
    maps = mistake_maps(trained, [first, first], [c for c, _ in chosen[0].targets], "grad_rollout")
    for grid, (target, _) in zip(maps, chosen[0].targets, strict=True):
        torch.testing.assert_close(grid, explain(trained.model, pixels, "grad_rollout", target=target).reshape(4, 4))


def _ranked_wrong_labels(probabilities: np.ndarray, labels: np.ndarray, threshold: np.ndarray) -> list:
    """(kind, evaluated index, label) of the grid, ranked here: the false positives with the highest probability,
    then the false negatives with the lowest, half of MAX_EXPLAINED each (one kind filling in for the other)."""
    predicted = probabilities >= threshold
    ranked = {}
    for sign, wrong, order in (("+", predicted & ~labels, -1.0), ("−", ~predicted & labels, 1.0)):
        found = np.argwhere(wrong).tolist()
        ranked[sign] = sorted(found, key=lambda ij: order * probabilities[ij[0], ij[1]])  # stable: ties by position
    taken = min(len(ranked["+"]), max(MAX_EXPLAINED // 2, MAX_EXPLAINED - len(ranked["−"])))
    chosen = [("+", *ij) for ij in ranked["+"][:taken]] + [("−", *ij) for ij in ranked["−"][: MAX_EXPLAINED - taken]]
    return [tuple(item) for item in chosen]


@pytest.mark.parametrize("negatives", [40, 2], ids=["many", "fewer-than-the-bound"])
def test_multi_label_chooses_the_most_confident_wrong_labels(negatives):
    """On outputs made here (no model): which (image, label) pairs the grid explains, and that label as the map's."""
    from vit_ft.tasks import task_for
    from vit_ft.tools.evaluate.outputs import EvalOutputs

    rng = np.random.default_rng(negatives)
    threshold = np.array([0.3, 0.5, 0.7])
    config = tiny_ft_config(problem_type=MULTI_LABEL, decision_threshold=threshold.tolist(), num_labels=3,
                            id2label=dict(enumerate(NAMES)), label2id={n: i for i, n in enumerate(NAMES)})  # fmt: skip
    logits = rng.normal(size=(30, 3)).astype(np.float32)
    probabilities = 1 / (1 + np.exp(-logits))
    labels = (probabilities >= threshold).astype(int)  # right everywhere, then some wrong labels of each kind
    cells = rng.permutation(90)
    for cell in cells[:negatives]:
        labels[cell // 3, cell % 3] = 1 - labels[cell // 3, cell % 3]
    outputs = EvalOutputs(logits, labels, np.arange(100, 130), [f"{i}.png" for i in range(30)], task=task_for(config))
    expected = _ranked_wrong_labels(probabilities, labels > 0, threshold)
    chosen = select_mistakes(outputs, dict(enumerate(NAMES)))
    assert [(m.targets[0][1][0], m.row - 100, m.targets[0][0]) for m in chosen] == expected
    assert len(chosen) == min(MAX_EXPLAINED, negatives)


@pytest.mark.long  # a second evaluation, with its figures: CI's long step
def test_multi_label_evaluation_draws_the_wrong_labels_maps(multi):
    model, data, report, metrics = multi
    trained, evaluated, outputs = _outputs(model, data)
    threshold = np.array(json.loads((model / "config.json").read_text())["decision_threshold"])
    expected = _ranked_wrong_labels(outputs.probabilities, outputs.labels > 0, threshold)
    chosen = select_mistakes(outputs, trained.id2label)
    assert [(m.targets[0][1][0], outputs.rows.tolist().index(m.row), m.targets[0][0]) for m in chosen] == expected
    assert metrics["explained_mistakes"] == {"method": "gradcam", "mistakes": len(chosen), "figure": MISTAKES_FIGURE}
    assert (report / MISTAKES_FIGURE).is_file() and len(chosen) == MAX_EXPLAINED
    image = evaluated.dataset[chosen[0].row]["image"]
    (grid,) = mistake_maps(trained, [image], [chosen[0].targets[0][0]], "gradcam")
    pixels = trained.transform.transform_image(image)[None]
    torch.testing.assert_close(grid, explain(trained.model, pixels, "gradcam", target=chosen[0].targets[0][0]).reshape(4, 4))


def test_none_and_the_librarys_default_draw_no_grid():
    # run_evaluation's own default is None (every other evaluation test: no grid); the command's is REPORT_METHOD
    assert check_report_method("none", "model") is None and check_report_method(None, "model") is None
    assert inspect.signature(run_evaluation).parameters["explain"].default is None
    assert evaluate_command.parse_args(["--model", "m", "--output_dir", "r"]).explain == REPORT_METHOD == "gradcam"


@pytest.mark.parametrize(
    ("script", "extra", "words"),
    [
        ("scripts/evaluate_model.py", ["--explain", "rollout"], "--explain rollout is class-agnostic"),
        ("scripts/evaluate_model.py", ["--explain", "saliency"], "--explain 'saliency' is not a method"),
        ("scripts/evaluate_model.py", ["--onnx"], "--explain) needs the PyTorch model"),
        ("scripts/predict.py", ["--onnx", "--explain", "gradcam"], "--explain needs the PyTorch model"),
    ],
    ids=["evaluate-rollout", "evaluate-unknown", "evaluate-onnx", "predict-onnx"],
)
def test_a_bad_explanation_is_one_error_line(single, tmp_path, capfd, script, extra, words):
    model, data, _, _ = single
    if "--onnx" in extra:  # an export folder: graphs, no PyTorch weights
        extra.remove("--onnx")
        model = tmp_path / "export"
        model.mkdir()
        (model / "config.json").write_text("{}")
        (model / "model.onnx").write_bytes(b"onnx")
    out = tmp_path / "out"
    where = ["--output_dir", str(out), "--data_dir", str(data)] if "evaluate" in script else [str(data), "--output", str(out / "p.csv")]
    result = run_script(script, ["--model", str(model), *where, *extra], capfd, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith("error: ") and words in lines[-1], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not out.exists()
