"""`vit-ft wise` (WiSE-FT): on the tiny fine-tune and a perturbed copy of it standing for the zero-shot model, the
saved model's weights are numpy's (1 - alpha) * zero-shot + alpha * fine-tuned, the chosen alpha is the curve's best
validation accuracy, the curve's alpha-1 point is the fine-tune's own validation accuracy, the output folder
predicts as any, and bad alphas or models of different shapes are one line each."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from vit_ft.tools.evaluate.data import resolve_eval_data
from vit_ft.tools.evaluate.outputs import predict_dataset
from vit_ft.tools.trained import load_trained
from vit_ft.tools.wise import run_wise

from ..cli_runner import run_script

SAMPLES = 24


@pytest.fixture(scope="module")
def zeroshot_dir(tiny_finetuned_dir, tmp_path_factory):
    """The tiny fine-tune's folder with every weight moved: a model of the same shapes and labels."""
    folder = tmp_path_factory.mktemp("zs") / "zs"
    shutil.copytree(tiny_finetuned_dir, folder)
    model = load_trained(str(folder)).model
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    return folder


@pytest.mark.long  # loads, evaluates and saves: about 3 s
def test_wise_interpolates_every_weight_and_keeps_the_best_alpha(tiny_finetuned_dir, zeroshot_dir, tmp_path):
    out = tmp_path / "wise"
    record = run_wise(str(zeroshot_dir), str(tiny_finetuned_dir), out, alphas=[0.0, 0.5, 1.0], max_samples=SAMPLES)
    curve = {row["alpha"]: row["validation"] for row in record["curve"]}
    assert record["alpha"] == max(sorted(curve), key=lambda a: (curve[a], -a))
    a, b, mixed = (load_file(f / "model.safetensors") for f in (zeroshot_dir, tiny_finetuned_dir, out))
    alpha = record["alpha"]
    for key, value in b.items():
        np.testing.assert_allclose(mixed[key], (1 - alpha) * a[key] + alpha * value, atol=1e-6)
    finetuned = load_trained(str(tiny_finetuned_dir))
    data = resolve_eval_data(finetuned.origin, finetuned.id2label, split="validation", max_samples=SAMPLES)
    outputs = predict_dataset(finetuned, data)
    assert curve[1.0] == pytest.approx(float((outputs.logits.argmax(-1) == outputs.labels).mean()))
    assert {"wise.png", "wise.csv", "wise.md", "wise.json", "preprocessor_config.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "vit_ft_run.json").read_text())["wise"]["alpha"] == alpha
    assert load_trained(str(out)).model.config.num_labels == finetuned.model.config.num_labels


def test_bad_alpha_and_other_shapes_are_one_line(tiny_finetuned_dir, hf_classifier_dir, tmp_path, capfd):
    result = run_script("scripts/wise.py",
                        ["--zeroshot", str(tiny_finetuned_dir), "--finetuned", str(tiny_finetuned_dir),
                         "--output_dir", str(tmp_path / "o"), "--alpha", "1.5"], capfd, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and "outside [0, 1]" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ValueError, match="different shapes"):
        run_wise(hf_classifier_dir, str(tiny_finetuned_dir), tmp_path / "w")


# --- wise_ft: the fine-tune's key that runs the start model, the fine-tune and their interpolation in one command ---

CPU = ["--use_cpu", "true", "--bf16", "false"]


@pytest.mark.parametrize(
    ("flags", "match"),
    [(["--wise_ft", "true"], "method full with head_init zero starts from a zero head"),
     (["--wise_ft", "true", "--method", "lora"], "method lora is not one"),
     (["--wise_shift", "corruptions"], "wise_shift is the shifted set of wise_ft's curve")],
)  # fmt: skip
def test_wise_ft_without_a_start_that_classifies_is_one_line(flags, match):
    from vit_ft.arguments.checks import RecipeError
    from vit_ft.arguments.recipes import build_plan

    with pytest.raises(RecipeError, match=match) as error:
        build_plan(["--recipe", "digits", *flags, *CPU])
    assert "\n" not in str(error.value)


def test_the_lpft_and_wise_recipes_plan_what_they_say():
    from vit_ft.arguments.recipes import build_plan

    lpft, wise = (build_plan(["--recipe", name, *CPU]) for name in ("digits-lpft", "digits-wise"))
    digits = build_plan(["--recipe", "digits", *CPU])
    assert lpft.model_args.method == wise.model_args.method == "lp-ft" and not lpft.data_args.wise_ft
    assert (wise.data_args.wise_ft, wise.data_args.wise_shift) == (True, "corruptions")
    assert lpft.training_args.learning_rate == wise.training_args.learning_rate == digits.training_args.learning_rate
    assert lpft.training_args.num_train_epochs == wise.training_args.num_train_epochs == digits.training_args.num_train_epochs


@pytest.mark.long  # three tiny runs (probe, LP-FT, interpolation with corruptions): about 40 s
def test_wise_ft_runs_the_start_the_fine_tune_and_their_interpolation(tmp_path, capfd):
    from ..conftest import write_tiny_recipe

    recipe = write_tiny_recipe(tmp_path, method="lp-ft", wise_ft=True, wise_shift="corruptions", max_eval_samples=16)
    ran = run_script("scripts/finetune.py", ["--recipe", str(recipe)], capfd, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = tmp_path / "out"
    start, finetuned = out / "wise" / "start", out / "wise" / "finetuned"
    assert json.loads((start / "vit_ft_run.json").read_text())["method"] == "linear"
    assert json.loads((finetuned / "vit_ft_run.json").read_text())["method"] == "lp-ft"
    record = json.loads((out / "wise.json").read_text())
    alpha = record["alpha"]
    assert alpha == max(record["curve"], key=lambda row: (row["validation"], -row["alpha"]))["alpha"]
    assert all("shifted" in row for row in record["curve"]) and record["shift"] == "corruptions"
    theta0, theta1 = load_file(start / "model.safetensors"), load_file(finetuned / "model.safetensors")
    mixed = load_file(out / "model.safetensors")
    for key, value in mixed.items():
        expected = (1 - alpha) * theta0[key].astype(np.float64) + alpha * theta1[key].astype(np.float64)
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6, err_msg=key)
    assert load_trained(str(out)).logits(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    assert json.loads((out / "vit_ft_run.json").read_text())["finished"] is True
