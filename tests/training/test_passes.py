"""Every pass a fine-tune makes besides training is announced, sized and scaled with the run (issue 52): the
feature bank follows `bank_max_images` and holds no more images than training saw, a run without a bank says
what it gives up, and where stderr is not a terminal (a Slurm log, `accelerate launch`'s pipe) each pass prints
plain progress lines, with no escape codes or carriage returns. After training, one pass over validation gives both
the calibration's logits and the bank threshold's features."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from transformers import ViTImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.fields import DataArguments
from vit_ft.arguments.pass_arguments import NO_BANK, bank_images
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments
from vit_ft.tasks import MultiLabel, SingleLabel
from vit_ft.tasks.feature_bank import BANK_MAX_IMAGES, FEATURE_BANK_FILE, FeatureBank
from vit_ft.tasks.temperature import fit_and_record_temperature
from vit_ft.training import outputs
from vit_ft.training.data import load_data
from vit_ft.training.inputs import attach_transforms
from vit_ft.training.trainer import build_trainer

from ..cli_runner import run_script
from ..conftest import randomize, tiny_ft_config, write_tiny_recipe


@pytest.mark.parametrize(
    "limit, train, trained, count, why",
    [
        (BANK_MAX_IMAGES, 96, 192, 96, "all of them"),  # a full run on small data: the whole split
        (40, 96, 192, 40, "bank_max_images 40"),
        (BANK_MAX_IMAGES, 96, 32, 32, "as many as training saw (32: steps x global batch)"),  # a smoke run
        (BANK_MAX_IMAGES, 50_000, 10**6, BANK_MAX_IMAGES, f"bank_max_images {BANK_MAX_IMAGES}"),
        (BANK_MAX_IMAGES, 96, None, 96, "all of them"),  # a probe: no steps, the whole split passed
        (None, 96, 192, 0, f"bank_max_images is None: {NO_BANK}"),
        (0, 96, 192, 0, f"bank_max_images is 0: {NO_BANK}"),
    ],
)
def test_the_bank_size_follows_the_key_and_the_images_training_saw(limit, train, trained, count, why):
    assert bank_images(limit, train, trained) == (count, why)


def _fine_tune(tmp_path, capfd, **overrides):
    recipe = write_tiny_recipe(tmp_path, **overrides)
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe)], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((tmp_path / "out" / "vit_ft_run.json").read_text())
    return result, record


# what each pass of a fine-tune prints on stderr while it runs, and its closing line
PASSES = ("Checking images (train): 96/96 img in ", "Evaluation: ", "Examples: ", "Feature bank: ",
          "Calibration + feature bank, validation: 48/48 img in ")  # fmt: skip


@pytest.mark.slow
def test_a_smoke_run_banks_the_images_it_trained_on_and_logs_plain_progress(tmp_path, capfd):
    # 2 steps x 16 images: 32 of the 96 training images seen, so the bank holds a stratified 32 (give or take
    # the per-class rounding of `stratified_rows`), not the 96 (or 20,000) of a full run
    result, record = _fine_tune(tmp_path, capfd, max_steps=2)
    bank = FeatureBank.load(tmp_path / "out" / FEATURE_BANK_FILE)
    assert abs(len(bank) - 32) <= 10 and record["feature_bank"]["images"] == len(bank)
    assert "Feature bank: " in result.stdout and "(as many as training saw (32: steps x global batch))" in (
        result.stdout
    )
    assert "\x1b" not in result.stderr and "\r" not in result.stderr  # a log file, not a terminal
    for line in PASSES:
        assert line in result.stderr, line
    assert f"Feature bank: {len(bank)}/{len(bank)} img in " in result.stderr
    # one pass over validation gave the temperature and the bank's threshold: no predict pass of its own
    assert "Calibration: predicting" not in result.stdout and "Feature bank, validation" not in result.stderr
    assert record["calibration"]["images"] == record["feature_bank"]["ood"]["images"] == 48
    # Trainer's bars became lines: one per logging step, with the rate and the time left
    assert "step 2/2: loss " in result.stdout and " steps/s, " in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("limit", [40, "none"])
def test_bank_max_images_caps_the_bank_or_skips_it_saying_what_is_given_up(tmp_path, capfd, limit):
    result, record = _fine_tune(tmp_path, capfd, num_train_epochs=1, bank_max_images=limit)
    if limit == "none":
        assert not (tmp_path / "out" / FEATURE_BANK_FILE).exists()
        assert record["feature_bank"] == {"written": False, "why": f"bank_max_images is None: {NO_BANK}"}
        assert "unlike the training images" in result.stdout
    else:  # 6 steps x 16 images saw all 96: the key is the cap
        assert abs(len(FeatureBank.load(tmp_path / "out" / FEATURE_BANK_FILE)) - 40) <= 10
        assert "(bank_max_images 40)" in result.stdout


def _trainer(tmp_path):
    """A tiny single-label Trainer on PNG folders (16 training and 24 validation images, two classes), untrained:
    what `save_outputs` gets once training ends, in seconds."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("test", 12)):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / name / f"{i}.png")
    data_args = DataArguments(train_dir=str(tmp_path / "train"), test_dir=str(tmp_path / "test"),
                              validation_split_percentage=0.0, check_images=False)  # fmt: skip
    args = FineTuneTrainingArguments(
        output_dir=str(tmp_path / "out"), eval_strategy="no", save_strategy="no", report_to="none",
        per_device_eval_batch_size=8, remove_unused_columns=False, label_names=["labels"], seed=0, use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    splits, names = load_data(data_args, args)
    splits["validation"] = splits["test"]
    model = randomize(ViTFTForImageClassification(tiny_ft_config(image_size=8, num_labels=2)))
    processor = ViTImageProcessorPil(size={"height": 8, "width": 8})
    transform = attach_transforms(splits, processor, data_args, seed=0)
    trainer, _ = build_trainer(model, processor, splits, args, data_args, SingleLabel(), [transform, None])
    return trainer, data_args


def test_one_validation_pass_gives_the_same_temperature_and_bank_threshold_as_two(tmp_path):
    trainer, data_args = _trainer(tmp_path)
    seen = []  # images through the patch embedding: one per image a forward pass sees
    trainer.model.vit.embeddings.patch_embeddings.register_forward_hook(lambda m, a, out: seen.append(len(out)))
    assert outputs._shares_validation_pass(trainer, data_args, SingleLabel())
    calibration = fit_and_record_temperature(trainer, trainer.eval_dataset)  # predict's pass, as before
    bank, none = outputs._feature_bank(trainer, data_args, seed=0)  # the bank's passes: training, validation
    separate, seen[:] = sum(seen), []
    shared_bank, shared = outputs._feature_bank(trainer, data_args, seed=0, shared=True)
    assert none is None and separate == 16 + 24 + 24
    assert sum(seen) == 16 + 24  # each training image once, each validation image once
    assert shared["images"] == calibration["images"] == 24
    assert shared["temperature"] == pytest.approx(calibration["temperature"], rel=1e-5)
    np.testing.assert_allclose(shared["nll"] + shared["ece"], calibration["nll"] + calibration["ece"], rtol=1e-5)
    assert shared_bank.ood == bank.ood and bank.ood["images"] == 24  # the same thresholds, bit for bit
    np.testing.assert_array_equal(shared_bank.features, bank.features)


def test_each_fit_keeps_its_own_pass_when_the_other_is_off(tmp_path):
    trainer, data_args = _trainer(tmp_path)
    assert not outputs._shares_validation_pass(trainer, data_args, MultiLabel())  # no temperature to fit
    no_bank = replace(data_args, bank_max_images=None)
    assert not outputs._shares_validation_pass(trainer, no_bank, SingleLabel())  # no bank to fit
    assert outputs._feature_bank(trainer, no_bank, seed=0) == (f"bank_max_images is None: {NO_BANK}", None)
    trainer.frozen_features = {"validation": None}  # a probe's pass over validation: the bank reads it instead
    assert not outputs._shares_validation_pass(trainer, data_args, SingleLabel())
    trainer.frozen_features, trainer.eval_dataset = {}, None  # no validation split: nothing to share
    assert not outputs._shares_validation_pass(trainer, data_args, SingleLabel())
