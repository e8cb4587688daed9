"""Tests for vit_ft.data.bad_images: every kind of broken file is found, named and dropped."""

import logging
from pathlib import Path

import datasets
import pytest
import torch
from PIL import Image

from vit_ft.data.bad_images import (
    BadImage,
    BadImageTally,
    SkipBadImages,
    check_bad_fraction,
    describe_rows,
    drop_bad_images,
    find_bad_images,
    prescan_small_splits,
)
from vit_ft.data.collate import collate_fn
from vit_ft.data.images import load_image
from vit_ft.data.transforms import INDEX_COLUMN, build_transforms

from ..sample_images import encoded, photo


@pytest.fixture
def mixed_files(tmp_path: Path) -> tuple[datasets.Dataset, dict[str, int]]:
    """A dataset of paths: good PNG/JPEG plus truncated, non-image, missing, empty and oversized files."""
    big_jpeg = encoded(photo(1200, 900), "JPEG", quality=90)
    files = {
        "good.png": encoded(photo(20, 20)),
        "good.jpg": big_jpeg,
        "truncated.jpg": big_jpeg[: len(big_jpeg) * 2 // 3],
        "truncated.png": encoded(photo(200, 200))[:500],
        "text.jpg": b"just some text",
        "empty.png": b"",
        "huge.png": encoded(Image.new("L", (1300, 1300))),
        "good2.png": encoded(photo(20, 20, seed=1)),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    paths = [str(tmp_path / name) for name in files] + [str(tmp_path / "missing.png")]
    ds = datasets.Dataset.from_dict({"image": paths, "label": list(range(len(paths)))}).cast_column(
        "image", datasets.Image()
    )
    return ds, {Path(p).name: i for i, p in enumerate(paths)}


def test_find_bad_images_reports_each_broken_file(mixed_files):
    ds, index = mixed_files
    bad = find_bad_images(ds, "image", max_pixels=1_500_000)
    found = {Path(path).name: (i, reason) for i, path, reason in bad}
    expected_bad = {"truncated.jpg", "truncated.png", "text.jpg", "empty.png", "huge.png", "missing.png"}
    assert set(found) == expected_bad
    assert all(found[name][0] == index[name] for name in found)
    assert "truncated" in found["truncated.jpg"][1].lower()
    assert "max_pixels" in found["huge.png"][1]
    assert "FileNotFoundError" in found["missing.png"][1]
    assert [i for i, _, _ in bad] == sorted(i for i, _, _ in bad)
    assert ds.features["image"].decode  # the caller's dataset is untouched


def test_find_bad_images_catches_truncation_although_it_decodes_in_draft_mode(mixed_files):
    ds, index = mixed_files
    raw = ds.cast_column("image", datasets.Image(decode=False))
    good_jpeg = raw[index["good.jpg"]]["image"]
    # the scan decodes at min_size=1: a 1200x900 JPEG comes out at 1/8 scale, yet truncation is caught
    assert load_image(good_jpeg, min_size=1).size == (150, 113)
    assert index["truncated.jpg"] in {i for i, _, _ in find_bad_images(ds, "image")}


def test_find_bad_images_in_parallel_matches_serial(mixed_files):
    ds, _ = mixed_files
    assert find_bad_images(ds, "image", num_proc=2) == find_bad_images(ds, "image")


def test_find_bad_images_names_a_missing_column(mixed_files):
    ds, _ = mixed_files
    with pytest.raises(KeyError, match=r"'img'.*\['image', 'label'\]"):
        find_bad_images(ds, "img")
    with pytest.raises(TypeError, match="not images"):
        find_bad_images(ds, "label")


def test_drop_bad_images_filters_and_logs(mixed_files, caplog):
    ds, index = mixed_files
    log = logging.getLogger("test_drop_bad_images")
    with caplog.at_level(logging.WARNING, logger=log.name):
        kept = drop_bad_images(ds, "image", log, max_listed=2)
    assert kept["label"][:] == [index["good.png"], index["good.jpg"], index["huge.png"], index["good2.png"]]
    assert isinstance(kept[0]["image"], Image.Image)  # still decoded like the input
    message = caplog.records[-1].getMessage()
    assert "Dropping 5 of 9 images" in message and "truncated.jpg" in message and "and 3 more" in message


def test_drop_bad_images_keeps_a_clean_dataset_and_refuses_an_all_bad_one(tmp_path: Path):
    log = logging.getLogger("test_drop_bad_images")
    clean = datasets.Dataset.from_dict(
        {"image": [photo(8, 8)]}, features=datasets.Features({"image": datasets.Image()})
    )
    assert drop_bad_images(clean, "image", log) is clean
    (tmp_path / "x.png").write_bytes(b"nope")
    broken = datasets.Dataset.from_dict({"image": [str(tmp_path / "x.png")]}).cast_column(
        "image", datasets.Image()
    )
    with pytest.raises(ValueError, match="None of the 1 images"):
        drop_bad_images(broken, "image", log)


# ---- at scale: no scan, a bad image skipped where the train transform decodes it ------------------------------


def as_train_split(ds: datasets.Dataset) -> datasets.Dataset:
    """`ds` as the fine-tune's train split: undecoded images, row positions, the seeded train transform."""
    split = ds.cast_column("image", datasets.Image(decode=False)).add_column(INDEX_COLUMN, list(range(len(ds))))
    split.set_transform(build_transforms(8, (0.5,) * 3, (0.5,) * 3, train=True, seed=3))
    return split


def test_a_bad_image_is_skipped_where_it_is_decoded_and_its_row_recorded(mixed_files):
    ds, _ = mixed_files
    split = as_train_split(ds)
    expected = [row for row, _, _ in find_bad_images(ds, "image")]  # the scan: the reference
    examples = [split[i] for i in range(len(split))]
    assert [i for i, e in enumerate(examples) if isinstance(e["pixel_values"], BadImage)] == expected
    tally = BadImageTally(len(split))
    batch = SkipBadImages(collate_fn, tally, INDEX_COLUMN)(examples)
    assert tally.rows() == expected and tally.count() == len(expected)
    good = [e for i, e in enumerate(examples) if i not in expected]
    # the batch is the good images' batch: which go depends only on the files (a resumed run drops the same)
    assert torch.equal(batch["pixel_values"], collate_fn(good)["pixel_values"])
    assert batch["labels"].tolist() == [e["labels"] for e in good]


def test_the_eval_transform_keeps_a_blank_image_in_place_of_a_bad_one(mixed_files):
    ds, index = mixed_files
    split = ds.cast_column("image", datasets.Image(decode=False))
    split.set_transform(build_transforms(8, (0.5,) * 3, (0.5,) * 3, train=False))
    assert torch.equal(split[index["text.jpg"]]["pixel_values"], torch.zeros(3, 8, 8))


def test_workers_record_bad_images_in_the_tally_the_main_process_reads(mixed_files):
    ds, _ = mixed_files
    split = as_train_split(ds)
    tally = BadImageTally(len(split))
    order = [0, 2, 1, 3, 6, 4, 7, 5, 8]  # a good image in each batch of 3
    loader = torch.utils.data.DataLoader(
        split, batch_size=3, sampler=order, num_workers=2, collate_fn=SkipBadImages(collate_fn, tally, INDEX_COLUMN)
    )
    seen = sum(len(batch["labels"]) for batch in loader)
    expected = [row for row, _, _ in find_bad_images(ds, "image")]
    assert tally.rows() == expected and seen == len(split) - len(expected)
    list(loader)  # a second epoch skips them again; each still counts once
    assert tally.count() == len(expected)


def test_the_tally_counts_examples_without_a_row_and_rows_past_its_size():
    tally = BadImageTally(4)
    for index in (None, 1, 5, 1):  # 5 folds onto row 1 of a split stated too short
        tally.record(index)
    assert tally.rows() == [1] and tally.count() == 2


def test_a_batch_of_bad_images_only_is_one_line():
    bad = {"pixel_values": BadImage("a/b.jpg", "OSError: broken data stream"), INDEX_COLUMN: 0}
    with pytest.raises(ValueError) as error:
        SkipBadImages(collate_fn, BadImageTally(1), INDEX_COLUMN)([bad])
    assert "a/b.jpg (OSError: broken data stream)" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("bad", "total", "max_fraction", "fails"),
    [(0, 100, 0.0, False), (1, 100, 0.0, True), (1, 100, 0.01, False), (2, 100, 0.01, True),
     (100, 100, 1.0, False), (3, 0, 0.01, False)],
)  # fmt: skip
def test_the_run_fails_once_more_than_the_set_fraction_is_bad(bad, total, max_fraction, fails):
    if not fails:
        check_bad_fraction(bad, total, max_fraction)
        return
    with pytest.raises(ValueError) as error:
        check_bad_fraction(bad, total, max_fraction, "x.jpg (OSError: truncated)")
    message = str(error.value)
    assert f"{bad} of the {total} training images" in message and "e.g. x.jpg (OSError: truncated)" in message
    assert "--max_bad_image_fraction" in message and "\n" not in message


def test_only_small_splits_are_scanned_before_training(mixed_files, caplog):
    ds, index = mixed_files
    log = logging.getLogger("test_prescan")
    with caplog.at_level(logging.INFO, logger=log.name):
        large = prescan_small_splits({"train": ds}, "image", log, max_images=len(ds) - 1)
    assert large["train"] is ds and "not scanned before training (above 8 images)" in caplog.text
    small = prescan_small_splits({"train": ds}, "image", log, max_images=len(ds))
    assert len(small["train"]) == len(ds) - len(find_bad_images(ds, "image"))


def test_skipped_rows_are_named_with_their_reason(mixed_files):
    ds, index = mixed_files
    split = as_train_split(ds)  # a transform set, as in training: the names come from the undecoded column
    named = describe_rows(split, [index["text.jpg"], index["missing.png"]])
    assert [Path(row["source"]).name for row in named] == ["text.jpg", "missing.png"]
    assert [row["row"] for row in named] == [index["text.jpg"], index["missing.png"]]
    assert "UnidentifiedImageError" in named[0]["reason"] and "FileNotFoundError" in named[1]["reason"]
