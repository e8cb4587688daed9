"""Multi-label fine-tunes end to end on real digits canvases (labels.csv folders): two CPU processes and an exact
resume, the decision threshold chosen on validation (recomputed here from the saved model), the metrics against
scikit-learn, LoRA with per-label thresholds and BCE positive weights, and the mistakes that must stop a run
before any model loads. The one-process fine-tunes run scripts/finetune.py in this process
(`tests.cli_runner.run_script`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, f1_score

from vit_ft.data.datasets import load_image_datasets
from vit_ft.data.digits import write_digits_multilabel_imagefolder
from vit_ft.data.multilabel import multi_hot_matrix
from vit_ft.metrics.multilabel import MULTI_LABEL, sigmoid, tune_class_thresholds, tune_global_threshold
from vit_ft.tasks.losses import MultiLabelLoss
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import REPO, tiny_ft_config, write_tiny_recipe
from .test_distributed import final_metrics, launch_two_processes

# 120 training canvases (108 after the 10% hold-out: with batch 16 per process and 2 processes, 4 steps an epoch)
CANVASES = {"num_train": 120, "num_test": 40}
SETTINGS = {
    "num_train_epochs": 2,
    "save_strategy": "steps",
    "save_steps": 2,
    "eval_strategy": "steps",
    "eval_steps": 2,
    "save_total_limit": None,
    "load_best_model_at_end": False,
    "max_train_samples": None,
    "max_eval_samples": None,
    "crop_scale_min": 0.8,
    "learning_rate": 0.01,
}


def canvases(tmp: Path) -> Path:
    return write_digits_multilabel_imagefolder(tmp / "dml", seed=0, **CANVASES)


def multilabel_recipe(tmp: Path, **overrides) -> Path:
    root = canvases(tmp)
    folders = {"train_dir": str(root / "train"), "test_dir": str(root / "test")}
    return write_tiny_recipe(tmp, **{**folders, **SETTINGS, **overrides})


def splits_as_trained(out: Path, seed: int = 0):
    """The run's validation and test splits, rebuilt as the fine-tune built them (its record's data arguments)."""
    data = json.loads((out / "vit_ft_run.json").read_text())["data"]
    splits, names = load_image_datasets(
        train_dir=data["train_dir"], test_dir=data["test_dir"], seed=seed,
        validation_split_percentage=data["validation_split_percentage"],
    )  # fmt: skip
    return splits, names


def probabilities(trained, dataset) -> np.ndarray:
    """Sigmoid probabilities of the trained model on every image of `dataset`, through its eval transform."""
    rows = dataset.with_format(None)
    pixels = torch.stack(trained.transform({"image": rows["image"]})["pixel_values"])
    return sigmoid(trained.logits(pixels).numpy())


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multilabel_ddp")
    recipe = multilabel_recipe(tmp)
    log = launch_two_processes(recipe, tmp)
    return tmp, recipe, log


@pytest.mark.long  # a two-process launch of its own: CI's step (the suite's: test_two_processes.py)
def test_two_process_multilabel_run_tunes_the_threshold_on_validation(two_process_run):
    tmp, _, log = two_process_run
    out = tmp / "out"
    record = json.loads((out / "vit_ft_run.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert record["world_size"] == 2 and record["problem_type"] == "multi_label_classification"
    assert config["problem_type"] == "multi_label_classification"
    # the recipes' default metric (accuracy) became the multi-label one, and no temperature was fitted
    assert "metric_for_best_model accuracy -> mAP" in log
    assert record["calibration"] is None
    chosen = record["decision_threshold"]
    assert chosen["kind"] == "global" and chosen["split"] == "validation"
    assert config["decision_threshold"] == chosen["value"]

    trained = load_trained(out, device="cpu")
    assert trained.task.problem_type == MULTI_LABEL and trained.temperature == 1.0
    splits, names = splits_as_trained(out)
    assert names == [str(d) for d in range(10)] and list(trained.id2label.values()) == names
    validation = multi_hot_matrix(splits["validation"]).astype(int)
    assert chosen["images"] == len(validation)
    val_probs = probabilities(trained, splits["validation"])
    # the saved threshold is the one validation chooses (the test split never does)
    assert chosen["value"] == pytest.approx(tune_global_threshold(validation, val_probs), abs=1e-6)
    metrics = record["metrics"]
    predicted = (val_probs >= chosen["value"]).astype(int)
    assert metrics["eval_f1_micro"] == pytest.approx(
        f1_score(validation, predicted, average="micro"), abs=1e-4
    )

    # test mAP: scikit-learn's macro average precision over the labels with a positive image
    test = multi_hot_matrix(splits["test"]).astype(int)
    test_probs = probabilities(trained, splits["test"])
    present = test.sum(0) > 0
    expected = average_precision_score(test[:, present], test_probs[:, present], average="macro")
    assert metrics["test_mAP"] == pytest.approx(expected, abs=1e-4)
    assert metrics["test_f1_macro"] == pytest.approx(
        f1_score(test, (test_probs >= chosen["value"]).astype(int), average="macro", zero_division=0),
        abs=1e-4,
    )
    assert (out / "training_curves.png").stat().st_size > 10_000
    examples = sorted(p.name for p in (out / "examples").iterdir())
    # named by every label of the canvas ("01_1_6_7.png": the second example, digits 1, 6 and 7)
    assert examples and any(name.count("_") >= 2 for name in examples)


@pytest.mark.long  # a second two-process launch; the exact two-process resume is in the suite: test_two_processes.py
def test_two_process_multilabel_run_resumes_exactly(two_process_run):
    tmp, recipe, _ = two_process_run
    out, resumed = tmp / "out", tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-4", resumed / "checkpoint-4")
    launch_two_processes(recipe, tmp, "--output_dir", str(resumed), "--resume")
    for name in ("eval_results.json", "test_results.json"):
        assert final_metrics(resumed / name) == final_metrics(out / name)
    losses = [
        [
            e["loss"]
            for e in json.loads((folder / "trainer_state.json").read_text())["log_history"]
            if "loss" in e
        ]
        for folder in (out, resumed)
    ]
    assert losses[0] == losses[1]
    assert (resumed / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (
        json.loads((resumed / "config.json").read_text())["decision_threshold"]
        == json.loads((out / "config.json").read_text())["decision_threshold"]
    )


def test_lora_with_per_label_thresholds_and_positive_weights(tmp_path, capfd):
    recipe = multilabel_recipe(
        tmp_path, use_lora=True, lora_r=4, decision_threshold="tune_per_class", pos_weight="balanced",
        num_train_epochs=1, eval_strategy="epoch", save_strategy="epoch", metric_for_best_model="mAP",
    )  # fmt: skip
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "BCE positive weights:" in result.stdout + result.stderr
    out = tmp_path / "out"
    record = json.loads((out / "vit_ft_run.json").read_text())
    trained = load_trained(out, device="cpu")
    assert trained.origin.adapter is not None and trained.task.problem_type == MULTI_LABEL
    splits, _ = splits_as_trained(out)
    validation = multi_hot_matrix(splits["validation"]).astype(int)
    val_probs = probabilities(trained, splits["validation"])
    expected = tune_class_thresholds(
        validation, val_probs, default=tune_global_threshold(validation, val_probs)
    )
    assert record["decision_threshold"]["kind"] == "per_class"
    np.testing.assert_allclose(trained.task.threshold, expected, atol=1e-6)
    np.testing.assert_allclose(record["decision_threshold"]["value"], expected, atol=1e-6)


def test_multilabel_loss_is_torch_bce_with_positive_weights():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=generator)
    labels = (torch.rand(6, 4, generator=generator) > 0.6).float()
    weights = torch.tensor([1.0, 3.0, 0.5, 2.0])
    expected = torch.nn.BCEWithLogitsLoss(pos_weight=weights)(logits, labels)
    torch.testing.assert_close(MultiLabelLoss(weights)({"logits": logits}, labels), expected)
    torch.testing.assert_close(
        MultiLabelLoss()((logits,), labels), F.binary_cross_entropy_with_logits(logits, labels)
    )
    # the model's own loss for problem_type multi-label is the same BCE (the loss Trainer uses without pos_weight)
    from vit_ft import ViTFTForImageClassification

    config = tiny_ft_config(num_labels=4, problem_type="multi_label_classification")
    model = ViTFTForImageClassification(config).eval()
    pixels = torch.randn(6, 3, 16, 16, generator=generator)
    out = model(pixel_values=pixels, labels=labels)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, labels))


def test_train_pos_weight_is_negatives_over_positives():
    import datasets

    from vit_ft.data.multilabel import multi_hot_feature
    from vit_ft.tasks.threshold import train_pos_weight

    matrix = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 0], [1, 0, 1]], dtype=np.float32)
    train = datasets.Dataset.from_dict(
        {"label": list(matrix)}, features=datasets.Features({"label": multi_hot_feature(3)})
    )
    args = type("Args", (), {"pos_weight": "balanced"})()
    # label 0: 3 positives, 1 negative; label 1: no positive -> 1; label 2: 2 and 2
    np.testing.assert_allclose(train_pos_weight(args, train, ["a", "b", "c"]).numpy(), [1 / 3, 1.0, 1.0])
    args.pos_weight = None
    assert train_pos_weight(args, train, ["a", "b", "c"]) is None


MISTAKES = [
    (
        ["--decision_threshold", "1.5"],
        "decision_threshold='1.5' must be 'tune', 'tune_per_class' or a probability",
    ),
    (["--mixup_alpha", "0.8"], "mixup_alpha / cutmix_alpha is single-label only"),
    (["--label_smoothing_factor", "0.1"], "label_smoothing_factor is single-label only"),
    (["--pos_weight", "often"], "pos_weight='often' is not supported"),
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any attempt to build the fine-tune's model fails the test: the mistakes must be caught before it."""
    from vit_ft.training import model

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the mistake was reported")

    monkeypatch.setattr(model.ViTFTForImageClassification, "from_pretrained", refuse)


@pytest.mark.parametrize(("flags", "message"), MISTAKES)
def test_multilabel_mistakes_are_one_line_before_the_model(tmp_path, capsys, no_model_loads, flags, message):
    from vit_ft.commands.finetune import main

    recipe = multilabel_recipe(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--recipe", str(recipe), *flags])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert exit_.value.code == 1 and len(errors) == 1 and message in errors[0], errors
    assert (
        not list((tmp_path / "out").glob("checkpoint-*")) and not (tmp_path / "out" / "config.json").exists()
    )


def test_single_label_data_refuses_multilabel_options(tmp_path, capsys, no_model_loads):
    from vit_ft.commands.finetune import main

    recipe = write_tiny_recipe(tmp_path, pos_weight="balanced")
    with pytest.raises(SystemExit):
        main(["--recipe", str(recipe)])
    err = capsys.readouterr().err
    assert (
        "error: pos_weight='balanced' is for multi-label data, but this data has one label per image" in err
    )
    # a labels.csv naming a missing file: one line naming the row, before any image or model loads
    root = canvases(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(root / "test", broken)
    with open(broken / "labels.csv", "a") as handle:
        handle.write("ghost.png,3\n")
    recipe = multilabel_recipe(tmp_path, test_dir=str(broken))
    with pytest.raises(SystemExit):
        main(["--recipe", str(recipe)])
    err = capsys.readouterr().err
    assert "names 'ghost.png', which is not a file in" in err and err.count("error: ") == 1, err


def test_digits_multilabel_recipe_is_the_builtin_one():
    """The offline recipe reads the built-in canvases (written when missing) and the digits pre-training."""
    from vit_ft.arguments.recipes import load_recipe, resolve_recipe

    recipe = load_recipe(resolve_recipe("digits-multilabel"))
    assert recipe["builtin_dataset"] == "digits-multilabel" and recipe["pretrain_if_missing"] == "digits"
    assert recipe["metric_for_best_model"] == "mAP" and recipe["decision_threshold"] == "tune"
    assert (REPO / "recipes" / "digits-multilabel.yaml").is_file()
    assert subprocess.run([sys.executable, "-c", "import vit_ft"], check=False).returncode == 0


def test_ema_and_early_stopping_watch_map(tmp_path, capfd):
    """The toolkit's label-agnostic knobs on multi-label data: the EMA is evaluated as eval_ema_mAP and early
    stopping watches the switched metric (mAP), the best checkpoint chosen on it."""
    recipe = multilabel_recipe(
        tmp_path, ema_decay=0.9, early_stopping_patience=1, early_stopping_threshold=1.0,
        load_best_model_at_end=True, num_train_epochs=3,
    )  # fmt: skip
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    evals = [entry for entry in state["log_history"] if "eval_mAP" in entry]
    assert evals and all("eval_ema_mAP" in entry for entry in evals)
    # an improvement of 1.0 in mAP is impossible: early stopping ends the run after the second evaluation
    assert len(evals) == 2 and state["global_step"] < 3 * 4
    assert state["best_metric"] == max(entry["eval_mAP"] for entry in evals)
