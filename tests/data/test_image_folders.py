"""Tests for vit_ft.data.image_folders: which sub-folders are classes. Hidden ones (a name starting with ".")
are skipped and said in the log; every other odd name is a class, in training and in evaluation alike."""

import logging
from pathlib import Path

import pytest

from vit_ft.data.datasets import load_image_datasets
from vit_ft.data.image_folders import check_class_folders, check_image_folder, is_hidden
from vit_ft.tools.evaluate.data import folder_eval_data

from ..sample_images import photo

# 10 folders: 7 plain, two hidden (one of them "..dots"), one "__dunder" (datasets' imagefolder drops it too)
FOLDERS = ["a", "b", "c", "d", "e", "f", ".hidden", "..dots", "__dunder", "we[ir]d*"]
CLASSES = ["__dunder", "a", "b", "c", "d", "e", "f", "we[ir]d*"]


@pytest.fixture
def odd_folder(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    for k, name in enumerate(FOLDERS):
        (root / name).mkdir(parents=True)
        for i in range(2):
            photo(6, 6, seed=10 * k + i).save(root / name / f"{i}.png")
    photo(6, 6).save(root / "a" / "__x.png")  # an odd file name is an image like any other
    photo(6, 6).save(root / "a" / "._x.png")  # a hidden one (macOS resource forks) is not
    return root


@pytest.mark.parametrize(
    "name, hidden",
    [
        (".hidden", True),
        ("..dots", True),
        (".x.png", True),
        ("__dunder", False),
        ("a.b", False),
        ("_", False),
    ],
)
def test_only_dot_names_are_hidden(name, hidden):
    assert is_hidden(name) is hidden


def test_hidden_class_folders_are_skipped_and_said_other_odd_names_are_classes(odd_folder, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vit_ft"):
        splits, names = load_image_datasets(
            train_dir=odd_folder, validation_split_percentage=0, cache_dir=str(tmp_path / "c")
        )
    assert names == CLASSES
    assert len(splits["train"]) == 2 * len(CLASSES) + 1  # a/__x.png counts, a/._x.png does not
    said = [r.getMessage() for r in caplog.records if "hidden class folder" in r.getMessage()]
    assert (
        len(said) == 1
        and "['..dots', '.hidden']" in said[0]
        and said[0].startswith(f"{odd_folder}: skipped 2 hidden")
    ), said


def test_evaluation_of_a_folder_sees_the_classes_training_sees(odd_folder):
    id2label = dict(enumerate(CLASSES))
    data = folder_eval_data(odd_folder, id2label)
    assert sorted(data.labels.tolist()) == sorted([i for i in range(len(CLASSES)) for _ in range(2)] + [1])


def test_folder_mistakes_name_the_flag_that_passed_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^--data_dir .*nowhere is not a directory"):
        check_image_folder(tmp_path / "nowhere", "--data_dir")
    one = tmp_path / "one"
    (one / ".hidden").mkdir(parents=True)
    (one / "cat").mkdir()
    photo(6, 6).save(one / "cat" / "0.png")
    photo(6, 6).save(one / ".hidden" / "0.png")
    with pytest.raises(ValueError, match=r"^--data_dir .*one has 1 class folder\(s\) \['cat'\]"):
        check_class_folders(check_image_folder(one, "--data_dir"), one, "--data_dir")
