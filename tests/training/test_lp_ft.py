"""`method: lp-ft` (Kumar et al. 2022) on the real digits: the linear probe first, then full fine-tuning from its
head, one run and one record. With a learning rate too small to move anything, the saved model equals `method:
linear`'s (the probe, itself tested against scikit-learn in test_probe_methods); head_init zeroshot with it is one line."""

from __future__ import annotations

import json

import pytest
import torch

from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe

RUN = {"num_train_epochs": 1, "max_train_samples": 48, "max_eval_samples": 24, "bank_max_images": 0,
       "learning_rate": 1e-12, "weight_decay": 0.0}  # fmt: skip


def _run(tmp_path, capfd, method, **overrides):
    recipe = write_tiny_recipe(tmp_path, method=method, output_dir=str(tmp_path / method), **{**RUN, **overrides})
    return run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path), tmp_path / method


@pytest.mark.long  # two fine-tunes
def test_lp_ft_starts_full_fine_tuning_from_the_linear_probe(tmp_path, capfd):
    result, lp_ft = _run(tmp_path, capfd, "lp-ft")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "LP-FT: the linear probe first" in result.stdout + result.stderr
    result, linear = _run(tmp_path, capfd, "linear")
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((lp_ft / "vit_ft_run.json").read_text())
    assert record["method"] == "lp-ft"
    assert json.loads((lp_ft / "trainer_state.json").read_text())["global_step"] > 0  # it did fine-tune
    a, b = load_trained(str(lp_ft)).model, load_trained(str(linear)).model
    torch.testing.assert_close(a.classifier.weight, b.classifier.weight, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.classifier.bias, b.classifier.bias, atol=1e-5, rtol=0)


def test_lp_ft_with_a_zeroshot_head_is_one_line():
    from vit_ft.arguments.fields import ModelArguments

    with pytest.raises(ValueError, match="method lp-ft fits its own head"):
        ModelArguments(model_name_or_path="google/vit-base-patch16-224-in21k", method="lp-ft", head_init="zeroshot")
