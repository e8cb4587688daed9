"""`vit-ft serve` beyond a model folder under PyTorch, each in a real server process on loopback (one per model
and runtime, started once for the module): an export folder under onnxruntime and OpenVINO (predict's
probabilities within the export's own tolerance), a multi-label model (the labels at or above its tuned
thresholds, with predict's sigmoid probabilities), a Hub id through the Hub stand-in (the answers of the folder it
was pushed from). A Hub id that does not exist, and PyTorch on an export folder, are one `error:` line."""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from vit_ft import ViTFTForImageClassification
from vit_ft.commands.serve import main as serve_main
from vit_ft.metrics.multilabel import MULTI_LABEL, THRESHOLD_ATTRIBUTE
from vit_ft.tools.export.onnx import FP32_TOLERANCE
from vit_ft.tools.serve.runtime import model_revision

from ..conftest import randomize, tiny_ft_config
from ..fake_hub import FakeHub
from .test_serve import ROOT, check_same, free_port, predictions_of, serving, uploads

HUB_ID = "me/vit-digits"
OPENVINO = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None,
    reason="openvino is not installed (pip install 'vit-ft[deploy]'; not in the dev extra)",
)
PACKAGES = {"onnx": "onnxruntime", "openvino": "openvino", "torch": "torch"}


def examples(folder: Path) -> list[Path]:
    return sorted((folder / "examples").glob("*.png"))


def ask_alone(url: str, files: list[Path]) -> list[dict]:
    """Each file in its own JSON request, all at once (the server batches them): the answers, in order."""

    def ask(path: Path) -> dict:
        image = {"name": path.name, "data": base64.b64encode(path.read_bytes()).decode()}
        response = httpx.post(f"{url}/predict", json={"images": [image]}, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["predictions"][0]

    with ThreadPoolExecutor(len(files)) as pool:
        return list(pool.map(ask, files))


def served_answers(url: str, files: list[Path], runtime: str) -> list[dict]:
    """`files` as one multipart request, then each alone and at once: every answer (runtime checked)."""
    response = httpx.post(f"{url}/predict", files=uploads(files), timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["runtime"] == runtime and [a["name"] for a in body["predictions"]] == [f.name for f in files]
    return body["predictions"] + ask_alone(url, files)


def check_info(url: str, runtime: str, labels: list[str]) -> dict:
    info = httpx.get(f"{url}/info", timeout=10).json()["model"]
    assert info["runtime"] == runtime and info["labels"] == labels
    assert info["versions"][PACKAGES[runtime]] != "not installed"
    return info


def json_labels(folder: Path) -> list[str]:
    id2label = json.loads((folder / "config.json").read_text())["id2label"]
    return [id2label[str(i)] for i in range(len(id2label))]


@pytest.fixture(scope="module")
def expected(tiny_finetuned_dir):
    return predictions_of(tiny_finetuned_dir, examples(tiny_finetuned_dir))


# ---- an export folder under onnxruntime and OpenVINO -------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tiny_finetuned_dir, tmp_path_factory) -> Path:
    """`vit-ft export --format onnx` of the tiny fine-tune (its calibration folded into the graph's head)."""
    from vit_ft.tools.export.onnx import export_onnx

    out = tmp_path_factory.mktemp("serve_export") / "onnx"
    assert export_onnx(tiny_finetuned_dir, out).fp32_difference <= FP32_TOLERANCE
    return out


@pytest.fixture(scope="module", params=["onnx", pytest.param("openvino", marks=OPENVINO)])
def export_server(request, exported, tmp_path_factory):
    """The export folder served by one runtime: (runtime, base url)."""
    flags = ["--runtime", request.param, "--max_batch", "8", "--batch_timeout_ms", "50"]
    with serving(exported, tmp_path_factory.mktemp(f"serve_{request.param}"), *flags) as (url, _, _):
        yield request.param, url


@pytest.mark.long
def test_an_export_folder_answers_predicts_probabilities(export_server, exported, expected, tiny_finetuned_dir):
    """Within the export's stated tolerance (FP32_TOLERANCE, its logits against PyTorch's), batched or not;
    no OOD score (a graph gives logits only); /info names the runtime and the export's revision."""
    runtime, url = export_server
    for answer in served_answers(url, examples(tiny_finetuned_dir), runtime):
        check_same(answer, expected, tolerance=FP32_TOLERANCE, scored=False)
    info = check_info(url, runtime, json_labels(exported))
    assert info["revision"] == model_revision(exported, str(exported))


def test_torch_on_an_export_folder_is_one_line(tmp_path, capsys):
    """An export folder's files (what the refusal reads: model.onnx, no weights; the graph itself is not read)."""
    (tmp_path / "model.onnx").write_bytes(b"")
    tiny_ft_config().save_pretrained(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        serve_main([str(tmp_path), "--port", str(free_port())])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--runtime onnx" in err[0], err


@pytest.fixture(scope="module")
def naflex_export(tmp_path_factory):
    """A tiny SigLIP 2 NaFlex classifier, its export, and images of several aspect ratios: (model, export, files)."""
    from transformers import Siglip2Config, Siglip2ForImageClassification
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    from vit_ft.tools.export.onnx import export_onnx

    from ..model.test_naflex import LABELS, TEXT, VISION
    from .test_naflex_export import IMAGE_SIZES, images

    tmp = tmp_path_factory.mktemp("serve_naflex")
    config = Siglip2Config(vision_config=VISION, text_config=TEXT, **LABELS)
    randomize(Siglip2ForImageClassification(config), seed=3).save_pretrained(tmp / "model")
    Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16).save_pretrained(tmp / "model")
    assert export_onnx(tmp / "model", tmp / "onnx").fp32_difference <= FP32_TOLERANCE
    files = [tmp / f"{h}x{w}.png" for h, w in IMAGE_SIZES]
    for image, path in zip(images(), files, strict=True):
        image.save(path)
    return tmp / "model", tmp / "onnx", files


@OPENVINO
@pytest.mark.long
def test_openvino_serves_a_naflex_export(naflex_export, tmp_path):
    """The graph's three NaFlex inputs fed by name: predict's probabilities within the export's tolerance on
    images of six aspect ratios, batched or not."""
    model, folder, files = naflex_export
    expected = predictions_of(model, files)
    with serving(folder, tmp_path, "--runtime", "openvino", "--batch_timeout_ms", "50") as (url, _, _):
        for answer in served_answers(url, files, "openvino"):
            check_same(answer, expected, tolerance=FP32_TOLERANCE, scored=False)


# ---- a multi-label model -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multilabel(tmp_path_factory):
    """A tiny random multi-label model whose tuned thresholds are each label's median probability on six images
    (read with a threshold of 1e-9, where predict lists every label): (model folder, images, probabilities)."""
    tmp = tmp_path_factory.mktemp("serve_multilabel")
    names = ["cat", "dog", "sky", "grass"]
    id2label = dict(enumerate(names))
    config = tiny_ft_config(id2label=id2label, label2id={n: i for i, n in id2label.items()}, problem_type=MULTI_LABEL)
    model = tmp / "model"
    randomize(ViTFTForImageClassification(config), seed=5).save_pretrained(model)
    (model / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "rescale_factor": 1 / 255, "resample": 2,
         "size": {"height": 16, "width": 16}}))  # fmt: skip
    rng = np.random.default_rng(2)
    images = [tmp / f"img{i}.png" for i in range(6)]
    for path in images:
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(path)

    def set_threshold(values: list[float]) -> None:
        saved = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**saved, THRESHOLD_ATTRIBUTE: values}))

    set_threshold([1e-9] * len(names))
    every = predictions_of(model, images)
    probabilities = np.array([[dict(zip(p.labels, p.scores, strict=True))[n] for n in names] for p in every.values()])
    set_threshold(np.median(probabilities, axis=0).tolist())
    return model, images, probabilities


@pytest.fixture(scope="module")
def multilabel_server(multilabel, tmp_path_factory):
    with serving(multilabel[0], tmp_path_factory.mktemp("serve_ml"), "--batch_timeout_ms", "50") as (url, _, _):
        yield url


@pytest.mark.long
def test_a_multi_label_model_answers_the_labels_at_or_above_its_thresholds(multilabel, multilabel_server):
    """predict's labels and sigmoid probabilities (to 1e-5), which are the labels whose probability (read at a
    threshold of 1e-9) is at or above the model's tuned threshold."""
    model, images, probabilities = multilabel
    expected = predictions_of(model, images)
    answers = served_answers(multilabel_server, images, "torch")
    for answer in answers:
        check_same(answer, expected, scored=False)  # a random model: no feature bank
    info = check_info(multilabel_server, "torch", ["cat", "dog", "sky", "grass"])
    thresholds = np.median(probabilities, axis=0)
    assert info["task"] == MULTI_LABEL
    for row, answer in zip(np.vstack([probabilities] * 2), answers, strict=True):
        above = {name: p for name, p, t in zip(info["labels"], row, thresholds, strict=True) if p >= t}
        assert dict(zip(answer["labels"], answer["scores"], strict=True)) == pytest.approx(above, abs=1e-5)
    assert any(a["labels"] for a in answers) and any(len(a["labels"]) < 4 for a in answers)  # a split, not all


# ---- a Hub id ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The Hub stand-in and a folder for its clients: (stand-in, folder)."""
    with FakeHub() as stand_in:
        yield stand_in, tmp_path_factory.mktemp("serve_hub")


@pytest.mark.long
def test_a_hub_id_answers_as_the_folder_it_was_pushed_from(hub, expected, tiny_finetuned_dir):
    """What `vit-ft push` sends of the tiny fine-tune by default (transformers' class, the calibration temperature
    folded into its head), served by its id: predict's answers on the folder, less the OOD score (the feature bank
    stays in the run folder)."""
    from vit_ft.tools.export.hub import stage_for_hub

    stand_in, tmp = hub
    commit = stand_in.add_repo(HUB_ID, stage_for_hub(tiny_finetuned_dir, tmp / "staged", HUB_ID))
    with serving(HUB_ID, tmp, "--batch_timeout_ms", "50", env=stand_in.env(tmp)) as (url, _, _):
        for answer in served_answers(url, examples(tiny_finetuned_dir), "torch"):
            check_same(answer, expected, scored=False)
        info = check_info(url, "torch", json_labels(tiny_finetuned_dir))
    assert info["model"] == HUB_ID and info["revision"] == f"hub:{HUB_ID}@{commit[:12]}"
    assert stand_in.downloaded() == {HUB_ID} and not stand_in.unexpected


def test_a_hub_id_that_does_not_exist_is_one_line(hub):
    stand_in, tmp = hub
    result = subprocess.run(
        [sys.executable, "-m", "vit_ft", "serve", "me/no-such-model", "--port", str(free_port())],
        cwd=tmp, env={**stand_in.env(tmp), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "me/no-such-model" in err[0], result.stderr
    assert "me/no-such-model" not in stand_in.downloaded() and not result.stdout.strip()
