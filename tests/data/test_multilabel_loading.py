"""`load_image_datasets` on multi-label data: what it chooses from the data, what `problem_type` forces, label
names of multi-hot columns, the stratified hold-out, and the mistakes it reports in one line."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from vit_ft.data.datasets import is_multi_label_dataset, load_image_datasets
from vit_ft.data.multilabel import multi_hot_matrix

NAMES = ["cat", "dog", "grass", "sky"]


def _images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(count)]


def _label_lists(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        sorted(rng.choice(len(NAMES), size=rng.integers(0, 3), replace=False).tolist()) for _ in range(count)
    ]


def _saved(tmp_path, train_labels, feature, test_labels=None):
    """A save_to_disk dataset (the path the Hub takes after download) with an image and a `tags` column."""
    features = datasets.Features({"picture": datasets.Image(), "tags": feature})
    splits = {
        "train": datasets.Dataset.from_dict(
            {"picture": _images(len(train_labels)), "tags": train_labels}, features=features
        )
    }
    if test_labels is not None:
        splits["test"] = datasets.Dataset.from_dict(
            {"picture": _images(len(test_labels), 1), "tags": test_labels}, features=features
        )
    path = tmp_path / "saved"
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return str(path)


def test_sequence_of_classlabel_dataset_becomes_multi_hot_with_a_stratified_hold_out(tmp_path):
    train, test = _label_lists(60), _label_lists(12, seed=1)
    path = _saved(tmp_path, train, datasets.Sequence(datasets.ClassLabel(names=NAMES)), test)
    splits, names = load_image_datasets(dataset_name=path, image_column="picture", label_column="tags",
                                        test_split="test", validation_split_percentage=0.2, seed=3)  # fmt: skip
    assert names == NAMES and all(is_multi_label_dataset(split) for split in splits.values())
    held = np.vstack([multi_hot_matrix(splits["train"]), multi_hot_matrix(splits["validation"])])
    expected = np.zeros((60, 4))
    for row, labels in enumerate(train):
        expected[row, labels] = 1
    # the two parts hold exactly the training rows, and every label with 2+ images sits in both
    assert sorted(map(tuple, held)) == sorted(map(tuple, expected))
    for part in ("train", "validation"):
        assert (multi_hot_matrix(splits[part]).sum(0)[expected.sum(0) >= 2] > 0).all()
    test_expected = np.zeros((12, 4))
    for row, labels in enumerate(test):
        test_expected[row, labels] = 1
    np.testing.assert_array_equal(multi_hot_matrix(splits["test"]), test_expected)  # test keeps its order


def test_multi_hot_column_takes_its_names_from_class_names(tmp_path):
    rows = np.eye(4, dtype=np.int64)[np.arange(20) % 4].tolist()
    path = _saved(tmp_path, rows, datasets.List(datasets.Value("int64")))
    splits, names = load_image_datasets(dataset_name=path, image_column="picture", label_column="tags",
                                        label_names=NAMES, validation_split_percentage=0.2)  # fmt: skip
    assert names == NAMES and is_multi_label_dataset(splits["train"])
    unnamed = load_image_datasets(dataset_name=path, image_column="picture", label_column="tags")[1]
    assert unnamed == ["0", "1", "2", "3"]  # positions, when nothing names them
    with pytest.raises(
        ValueError, match=r"row 0 holds \[1, 0, 0, 0\], not a multi-hot 0/1 vector of length 3"
    ):
        load_image_datasets(
            dataset_name=path, image_column="picture", label_column="tags", label_names=NAMES[:3]
        )


def test_problem_type_forces_or_refuses(tmp_path):
    single = _saved(tmp_path, [i % 4 for i in range(20)], datasets.ClassLabel(names=NAMES))
    splits, names = load_image_datasets(dataset_name=single, image_column="picture", label_column="tags",
                                        problem_type="multi_label_classification")  # fmt: skip
    assert names == NAMES and is_multi_label_dataset(splits["train"])
    assert (multi_hot_matrix(splits["train"]).sum(1) == 1).all()  # one label per image, as one-hot vectors
    multi = _saved(tmp_path / "m", _label_lists(20), datasets.Sequence(datasets.ClassLabel(names=NAMES)))
    with pytest.raises(
        ValueError, match="holds several labels per image .* leave problem_type unset"
    ) as error:
        load_image_datasets(dataset_name=multi, image_column="picture", label_column="tags",
                            problem_type="single_label_classification")  # fmt: skip
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="problem_type='regression' is not one of"):
        load_image_datasets(
            dataset_name=multi, image_column="picture", label_column="tags", problem_type="regression"
        )
    with pytest.raises(
        TypeError, match=r"label_column='tags' of split 'train' .* holds .*; accepted: one label"
    ):
        load_image_datasets(dataset_name=_saved(tmp_path / "f", [0.5] * 20, datasets.Value("float32")),
                            image_column="picture", label_column="tags")  # fmt: skip


def test_labelled_train_folder_needs_labelled_other_folders(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    for i, image in enumerate(_images(6)):
        image.save(train / f"{i}.png")
    (train / "labels.csv").write_text(
        "file,labels\n" + "".join(f"{i}.png,{NAMES[i % 4]};sky\n" for i in range(6))
    )
    test = tmp_path / "test" / "cat"
    test.mkdir(parents=True)
    _images(1)[0].save(test / "a.png")
    with pytest.raises(
        ValueError, match=r"train_dir=.* holds labels.csv / labels.jsonl \(multi-label\) but test_dir="
    ):
        load_image_datasets(train_dir=train, test_dir=tmp_path / "test")
    splits, names = load_image_datasets(train_dir=train, validation_split_percentage=0.0)
    assert names == NAMES and multi_hot_matrix(splits["train"]).shape == (6, 4)
