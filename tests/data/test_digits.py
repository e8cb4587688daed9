"""Tests for vit_ft.data.digits: the built-in digits folders hold scikit-learn's digits, are written once and
atomically, and load as image folders."""

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_ft.data.datasets import load_image_datasets
from vit_ft.data.digits import write_digits_imagefolder


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory) -> Path:
    return write_digits_imagefolder(tmp_path_factory.mktemp("digits") / "digits")


def test_digits_counts_per_class_and_split(digits_root: Path):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train_idx, test_idx = train_test_split(
        np.arange(len(target)), test_size=0.2, stratify=target, random_state=0
    )
    for split, indices in (("train", train_idx), ("test", test_idx)):
        on_disk = Counter(p.parent.name for p in (digits_root / split).glob("*/*.png"))
        assert on_disk == Counter(str(target[i]) for i in indices)
        assert {int(p.stem) for p in (digits_root / split).glob("*/*.png")} == set(indices.tolist())
    assert sum(1 for _ in digits_root.glob("*/*/*.png")) == 1797


def test_digits_pixels_round_trip(digits_root: Path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    for path in (
        list((digits_root / "train").glob("*/*.png"))[:50] + list((digits_root / "test").glob("*/*.png"))[:50]
    ):
        img = Image.open(path)
        assert img.mode == "L" and img.size == (8, 8)
        expected = np.rint(digits.images[int(path.stem)] * 255 / 16)
        assert np.array_equal(np.asarray(img), expected)
        assert int(path.parent.name) == digits.target[int(path.stem)]


def test_digits_load_as_image_folders(digits_root: Path, tmp_path: Path):
    splits, names = load_image_datasets(
        train_dir=digits_root / "train", validation_dir=digits_root / "test", cache_dir=str(tmp_path / "c")
    )
    assert names == [str(d) for d in range(10)]
    assert (len(splits["train"]), len(splits["validation"])) == (1437, 360)


def test_digits_written_once(digits_root: Path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a complete folder must not be rewritten")

    monkeypatch.setattr(Image.Image, "save", fail)
    assert write_digits_imagefolder(digits_root) == digits_root
    with pytest.raises(FileExistsError, match="seed=0"):
        write_digits_imagefolder(digits_root, seed=1)


def test_digits_interrupted_write_leaves_nothing_that_looks_complete(tmp_path: Path, monkeypatch):
    root = tmp_path / "digits"
    real_save = Image.Image.save
    saved = []

    def crash_after_100(self, *args, **kwargs):
        if len(saved) == 100:
            raise KeyboardInterrupt("killed")
        saved.append(args[0])
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", crash_after_100)
    with pytest.raises(KeyboardInterrupt):
        write_digits_imagefolder(root)
    assert len(saved) == 100 and not root.exists()
    assert list(tmp_path.iterdir()) == []  # the staging folder was cleaned up
    monkeypatch.setattr(Image.Image, "save", real_save)
    assert sum(1 for _ in write_digits_imagefolder(root).glob("*/*/*.png")) == 1797


def test_digits_refuses_a_foreign_or_damaged_folder(tmp_path: Path, digits_root: Path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a complete digits image folder"):
        write_digits_imagefolder(foreign)
    damaged = shutil.copytree(digits_root, tmp_path / "damaged")
    next(iter((damaged / "test").glob("*/*.png"))).unlink()
    with pytest.raises(FileExistsError, match="damaged"):
        write_digits_imagefolder(damaged)
