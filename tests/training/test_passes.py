"""Every pass a fine-tune makes besides training is announced, sized and scaled with the run (issue 52): the
feature bank follows `bank_max_images` and holds no more images than training saw, a run without a bank says
what it gives up, and where stderr is not a terminal (a Slurm log, `accelerate launch`'s pipe) each pass prints
plain progress lines, with no escape codes or carriage returns."""

from __future__ import annotations

import json

import pytest

from vit_ft.arguments.pass_arguments import NO_BANK, bank_images
from vit_ft.tasks.feature_bank import BANK_MAX_IMAGES, FEATURE_BANK_FILE, FeatureBank

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe


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
          "Feature bank, validation: 48/48 img in ")  # fmt: skip


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
