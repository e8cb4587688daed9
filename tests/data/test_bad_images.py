"""Tests for vit_ft.data.bad_images: every kind of broken file is found, named and dropped."""

import logging
from pathlib import Path

import datasets
import pytest
from PIL import Image

from vit_ft.data.bad_images import drop_bad_images, find_bad_images
from vit_ft.data.images import load_image

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
