"""Tests for vit_ft.data.digits: each canvas holds exactly the scikit-learn digits its labels name,
the folders are deterministic, written once, and no source digit image is in both splits."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_ft.data.digits import source_split, write_digits_multilabel_imagefolder
from vit_ft.data.label_files import read_labelled_folder
from vit_ft.data.multilabel import multi_hot_matrix


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_digits_multilabel_imagefolder(
        tmp_path_factory.mktemp("dml") / "dml", num_train=60, num_test=20
    )


def _layout(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "layout.jsonl").read_text().splitlines()]


def test_labels_are_the_digits_drawn(root: Path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    for split in ("train", "test"):
        rows = dict(line.split(",") for line in (root / split / "labels.csv").read_text().splitlines()[1:])
        for item in _layout(root / split):
            canvas = np.asarray(Image.open(root / split / item["file"])).astype(int)
            assert canvas.shape == (32, 32) and 1 <= len(item["digits"]) <= 3
            drawn = np.zeros_like(canvas)
            for placed in item["digits"]:
                # the source digit, upscaled 2x by repetition, independently of the writer's np.kron
                expected = np.rint(digits.images[placed["source"]] * 255 / 16).repeat(2, 0).repeat(2, 1)
                top, left = placed["top"], placed["left"]
                assert np.array_equal(canvas[top : top + 16, left : left + 16], expected)
                assert placed["digit"] == digits.target[placed["source"]]
                drawn[top : top + 16, left : left + 16] += 1
            assert drawn.max() == 1  # no two digits overlap
            assert not canvas[drawn == 0].any()  # nothing else is drawn
            names = {str(digits.target[p["source"]]) for p in item["digits"]}
            assert rows[item["file"]] == ";".join(sorted(names))


def test_source_digits_never_in_both_splits(root: Path):
    train_sources = {p["source"] for item in _layout(root / "train") for p in item["digits"]}
    test_sources = {p["source"] for item in _layout(root / "test") for p in item["digits"]}
    assert not train_sources & test_sources
    train_split, test_split = source_split(0)
    # the digits folders' split: the built-in pre-training (digits/train) never sees a test canvas's digit
    assert train_sources <= set(train_split.tolist()) and test_sources <= set(test_split.tolist())
    assert len(train_split) == 1437 and not set(train_split) & set(test_split)


def test_deterministic_and_written_once(root: Path, tmp_path: Path, monkeypatch):
    again = write_digits_multilabel_imagefolder(tmp_path / "again", num_train=60, num_test=20)
    for split in ("train", "test"):
        assert (again / split / "labels.csv").read_text() == (root / split / "labels.csv").read_text()
        assert (again / split / "layout.jsonl").read_text() == (root / split / "layout.jsonl").read_text()
    other = write_digits_multilabel_imagefolder(tmp_path / "seed1", seed=1, num_train=60, num_test=20)
    assert (other / "train" / "labels.csv").read_text() != (root / "train" / "labels.csv").read_text()

    def fail(*args, **kwargs):
        raise AssertionError("a complete folder must not be rewritten")

    monkeypatch.setattr(Image.Image, "save", fail)
    assert write_digits_multilabel_imagefolder(root, num_train=60, num_test=20) == root
    with pytest.raises(FileExistsError, match="seed=0, num_train=60, num_test=20"):
        write_digits_multilabel_imagefolder(root, seed=1, num_train=60, num_test=20)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(FileExistsError, match="not a complete digits-multilabel folder"):
        write_digits_multilabel_imagefolder(tmp_path / "busy")


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch):
    real_save, saved = Image.Image.save, []

    def crash_after_10(self, *args, **kwargs):
        if len(saved) == 10:
            raise KeyboardInterrupt("killed")
        saved.append(args[0])
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", crash_after_10)
    with pytest.raises(KeyboardInterrupt):
        write_digits_multilabel_imagefolder(tmp_path / "dml", num_train=20, num_test=5)
    assert list(tmp_path.iterdir()) == []


def test_reads_as_a_multilabel_folder(root: Path):
    train, names = read_labelled_folder(root / "train")
    test, _ = read_labelled_folder(root / "test", argument="test_dir", names=names)
    assert names == [str(d) for d in range(10)] and (len(train), len(test)) == (60, 20)
    first = _layout(root / "train")[0]
    expected = np.zeros(10)
    expected[[p["digit"] for p in first["digits"]]] = 1
    np.testing.assert_array_equal(multi_hot_matrix(train)[0], expected)
