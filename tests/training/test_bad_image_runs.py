"""Fine-tunes on data with broken images and no scan before training (as on large data): each bad training image
is skipped where the workers decode it, counted once, named in vit_ft_run.json, and the run fails with one line
when more than max_bad_image_fraction of the images are bad (vit_ft.data.bad_images, training.callbacks)."""

import json
from pathlib import Path

import pytest

from vit_ft.arguments.recipes import parse_args
from vit_ft.data.bad_images import find_bad_images
from vit_ft.training.callbacks import BadImageCallback
from vit_ft.training.data import load_data

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe

BROKEN = {"check_images": False, "dataloader_num_workers": 2, "dataloader_persistent_workers": True}


@pytest.fixture(scope="module")
def broken_data(tmp_path_factory) -> tuple[Path, Path, set[str]]:
    """The tiny recipe's digits with every 7th training image cut short or replaced by text: the folder, the
    recipe and the paths of the broken training images the run trains on (by `find_bad_images`, the scan)."""
    tmp = tmp_path_factory.mktemp("broken")
    recipe = write_tiny_recipe(tmp, **BROKEN)
    for i, path in enumerate(sorted((tmp / "digits" / "train").rglob("*.png"))):
        if i % 7 == 0:
            path.write_bytes(path.read_bytes()[:40] if i % 2 else b"not an image")
    _, data_args, training_args = parse_args(["--recipe", str(recipe)])
    splits, _ = load_data(data_args, training_args)  # check_images false: nothing dropped
    bad = {source for _, source, _ in find_bad_images(splits["train"], "image")}
    assert 2 <= len(bad) < len(splits["train"]) // 4
    return tmp, recipe, bad


def test_bad_training_images_are_skipped_counted_and_named_in_the_run_record(broken_data, capfd):
    tmp, recipe, bad = broken_data
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--max_bad_image_fraction", "0.5",
                                                "--output_dir", str(tmp / "kept")], capfd, cwd=tmp)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp / "kept" / "vit_ft_run.json").read_text())["bad_images"]
    assert record["skipped"] == len(bad) and record["of"] == 96 and record["max_bad_image_fraction"] == 0.5
    assert record["counted_from_step"] == 0
    assert {image["source"] for image in record["images"]} == bad
    assert all(image["reason"].startswith(("UnidentifiedImageError", "OSError")) for image in record["images"])
    assert f"Skipped {len(bad)} of 96 training images that do not decode" in result.stdout + result.stderr


def test_more_bad_images_than_the_set_fraction_fail_the_run_with_one_line(broken_data, capfd):
    tmp, recipe, bad = broken_data
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--max_bad_image_fraction", "0.01",
                                                "--output_dir", str(tmp / "failed")], capfd, cwd=tmp)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "of the 96 training images" in last and "do not decode, e.g. " in last
    assert "max_bad_image_fraction=0.01" in last and any(source in last for source in bad)


def test_the_callback_fails_at_the_step_that_passes_the_fraction():
    callback = BadImageCallback(100, 0.02)
    for row in (3, 3, 9):  # a row seen twice counts once
        callback.tally.record(row)
    callback.on_step_end(None, None, None)  # 2 of 100: not more than 2 %
    callback.tally.record(50)
    with pytest.raises(ValueError, match=r"3 of the 100 training images \(3\.0%\) do not decode, e.g. row 3"):
        callback.on_step_end(None, None, None)
    assert callback.record()["skipped"] == 3 and callback.record()["images"] == [{"row": r} for r in (3, 9, 50)]


def test_the_scan_runs_outside_the_barrier_that_waits_on_the_main_process(tmp_path, monkeypatch):
    """Inside `main_process_first` the other processes wait while process 0 works, then work while it waits:
    a scan there costs every process the scan of all of them."""
    from contextlib import contextmanager

    from vit_ft.training import data

    _, data_args, training_args = parse_args(["--recipe", str(write_tiny_recipe(tmp_path))])
    inside, scanned = [], []

    @contextmanager
    def main_process_first(self, local=True, desc="work"):
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    def scan(splits, *args, **kwargs):
        scanned.append(bool(inside))
        return splits

    monkeypatch.setattr(type(training_args), "main_process_first", main_process_first)
    monkeypatch.setattr(data, "prescan_small_splits", scan)
    load_data(data_args, training_args)
    assert scanned == [False]
