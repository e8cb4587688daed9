"""Tests for vit_ft.data.datasets: image folders, save_to_disk folders and Hub datasets load with consistent labels,
a seeded stratified validation hold-out and seeded subsets; every error names the fix."""

from collections import Counter
from pathlib import Path

import datasets
import pytest
from PIL import Image

from vit_ft.data.datasets import load_image_datasets

from ..sample_images import encoded, photo


def make_folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (12, 10), seed: int = 0) -> Path:
    """root/<class>/<i>.png with counts[class] images each."""
    for k, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            photo(*size, seed=seed + 100 * k + i).save(root / name / f"{i}.png")
    return root


def test_load_image_folders_with_consistent_labels(tmp_path: Path):
    train_dir = make_folder(tmp_path / "train", {"cat": 3, "dog": 3, "fish": 3})
    val_dir = make_folder(
        tmp_path / "val", {"dog": 2, "fish": 1}
    )  # no cats: its own ids would be dog=0, fish=1
    splits, names = load_image_datasets(
        train_dir=train_dir, validation_dir=val_dir, cache_dir=str(tmp_path / "c")
    )
    assert names == ["cat", "dog", "fish"]
    assert list(splits) == ["train", "validation"]
    for split, expected in (
        ("train", {"cat": 3, "dog": 3, "fish": 3}),
        ("validation", {"dog": 2, "fish": 1}),
    ):
        ds = splits[split]
        assert ds.column_names == ["image", "label"]
        assert ds.features["label"].names == names
        raw = ds.cast_column("image", datasets.Image(decode=False))
        folders = [Path(row["image"]["path"]).parent.name for row in raw]
        assert folders == [names[label] for label in raw["label"]]  # id -> name matches the folder
        assert Counter(folders) == expected


def test_load_image_folders_rejects_a_class_missing_from_train(tmp_path: Path):
    train_dir = make_folder(tmp_path / "train", {"cat": 2, "dog": 2})
    val_dir = make_folder(tmp_path / "val", {"cat": 1, "zebra": 1})
    with pytest.raises(ValueError, match=r"\['zebra'\].*validation_dir"):
        load_image_datasets(train_dir=train_dir, validation_dir=val_dir, cache_dir=str(tmp_path / "c"))


def test_load_image_folders_checks_the_layout(tmp_path: Path):
    cache = str(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="validation_dir=.*nowhere"):
        load_image_datasets(
            train_dir=make_folder(tmp_path / "t", {"a": 1}),
            validation_dir=tmp_path / "nowhere",
            cache_dir=cache,
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no image files"):
        load_image_datasets(train_dir=tmp_path / "empty", cache_dir=cache)
    flat = tmp_path / "flat"
    flat.mkdir()
    photo(8, 8).save(flat / "x.png")
    with pytest.raises(ValueError, match="class sub-folders.*'x.png'"):
        load_image_datasets(train_dir=flat, cache_dir=cache)
    with pytest.raises(ValueError, match="exactly one data source"):
        load_image_datasets(cache_dir=cache)


def test_load_holds_out_a_stratified_seeded_validation_split(tmp_path: Path):
    train_dir = make_folder(tmp_path / "train", {"a": 20, "b": 10}, size=(4, 4))
    test_dir = make_folder(tmp_path / "test", {"a": 2, "b": 2}, size=(4, 4))
    cache = str(tmp_path / "c")
    splits, names = load_image_datasets(
        train_dir=train_dir, test_dir=test_dir, validation_split_percentage=0.2, cache_dir=cache
    )
    assert list(splits) == ["train", "validation", "test"]
    assert Counter(splits["validation"]["label"]) == {0: 4, 1: 2}  # 20% of each class
    assert Counter(splits["train"]["label"]) == {0: 16, 1: 8}
    again, _ = load_image_datasets(train_dir=train_dir, validation_split_percentage=0.2, cache_dir=cache)
    other, _ = load_image_datasets(
        train_dir=train_dir, validation_split_percentage=0.2, seed=1, cache_dir=cache
    )

    def paths(ds):
        return [row["path"] for row in ds.cast_column("image", datasets.Image(decode=False))["image"]]

    assert paths(again["validation"]) == paths(splits["validation"])
    assert paths(other["validation"]) != paths(splits["validation"])
    with pytest.raises(ValueError, match="validation_split_percentage=1.5"):
        load_image_datasets(train_dir=train_dir, validation_split_percentage=1.5, cache_dir=cache)
    unsplit, _ = load_image_datasets(train_dir=train_dir, validation_split_percentage=0, cache_dir=cache)
    assert list(unsplit) == ["train"] and len(unsplit["train"]) == 30
    lonely = make_folder(tmp_path / "lonely", {"a": 5, "b": 1}, size=(4, 4))
    with pytest.raises(ValueError, match="smallest class: 1 images.*provide a validation split"):
        load_image_datasets(train_dir=lonely, cache_dir=cache)


def test_load_limits_samples_with_a_seeded_shuffle(tmp_path: Path):
    train_dir = make_folder(tmp_path / "train", {"a": 10, "b": 10}, size=(4, 4))
    splits, _ = load_image_datasets(
        train_dir=train_dir,
        validation_dir=train_dir,
        max_train_samples=6,
        max_eval_samples=4,
        cache_dir=str(tmp_path / "c"),
    )
    assert (len(splits["train"]), len(splits["validation"])) == (6, 4)
    assert len(set(splits["train"]["label"])) == 2  # a shuffle, not the first six (all class "a")


@pytest.fixture
def saved_hub_like(tmp_path: Path) -> Path:
    """A save_to_disk DatasetDict shaped like a Hub dataset: other column names, string labels, extra columns."""

    def split(labels: list[str], seed: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {
                "img": [photo(6, 6, seed=seed + i) for i in range(len(labels))],
                "fine_label": labels,
                "caption": [f"image {i}" for i in range(len(labels))],
                "height": [6] * len(labels),
            },
            features=datasets.Features(
                {
                    "img": datasets.Image(),
                    "fine_label": datasets.Value("string"),
                    "caption": datasets.Value("string"),
                    "height": datasets.Value("int32"),
                }
            ),
        )

    path = tmp_path / "hub_like"
    datasets.DatasetDict(
        {
            "train": split(["tulip", "rose", "daisy"] * 4, 0),
            "valid": split(["rose", "daisy"], 50),
            "holdout": split(["tulip"], 60),
        }
    ).save_to_disk(str(path))
    return path


def test_load_named_dataset_renames_columns_and_encodes_string_labels(saved_hub_like: Path):
    splits, names = load_image_datasets(
        dataset_name=str(saved_hub_like),
        validation_split="valid",
        test_split="holdout",
        image_column="img",
        label_column="fine_label",
    )
    assert names == ["daisy", "rose", "tulip"]
    assert list(splits) == ["train", "validation", "test"]
    assert splits["validation"].column_names == ["image", "label"]
    assert splits["validation"]["label"][:] == [1, 0]
    assert splits["test"]["label"][:] == [2]
    assert all(split.features["label"] == datasets.ClassLabel(names=names) for split in splits.values())
    assert isinstance(splits["train"][0]["image"], Image.Image)


def test_load_named_dataset_errors_name_the_alternatives(saved_hub_like: Path):
    common = {"dataset_name": str(saved_hub_like), "image_column": "img", "label_column": "fine_label"}
    with pytest.raises(KeyError, match=r"validation_split='validation'.*'valid'"):
        load_image_datasets(**common)  # the default name is absent but a validation-like split exists
    with pytest.raises(KeyError, match=r"test_split='test'.*\['holdout', 'train', 'valid'\]"):
        load_image_datasets(**common, validation_split="valid", test_split="test")
    with pytest.raises(KeyError, match=r"label_column='label'.*\['img', 'fine_label', 'caption', 'height'\]"):
        load_image_datasets(dataset_name=str(saved_hub_like), image_column="img", validation_split="valid")
    with pytest.raises(TypeError, match="image_column='height'"):
        load_image_datasets(**{**common, "image_column": "height"}, validation_split="valid")
    with pytest.raises(TypeError, match="label_column='img'"):
        load_image_datasets(
            **{**common, "image_column": "caption", "label_column": "img"}, validation_split="valid"
        )


def test_load_hub_dataset_goes_through_load_dataset(monkeypatch, tmp_path: Path):
    labels = [3, 5, 7, 3, 5, 7, 3, 5, 7, 3, 5, 7]  # int labels that are not 0..K-1
    hub = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"image": [encoded(photo(5, 5, seed=i)) for i in range(12)], "label": labels},
                features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
            )
        }
    )
    calls = []

    def fake_load_dataset(name, config=None, cache_dir=None):
        calls.append((name, config, cache_dir))
        return hub

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    splits, names = load_image_datasets(
        dataset_name="someone/flowers",
        dataset_config="small",
        validation_split_percentage=0.25,
        cache_dir="/cache",
    )
    assert calls == [("someone/flowers", "small", "/cache")]
    assert names == ["3", "5", "7"]
    assert Counter(splits["validation"]["label"]) == {0: 1, 1: 1, 2: 1}
    assert sorted(names[i] for i in splits["train"]["label"]) == sorted(str(v) for v in labels[:9])


def test_unknown_hub_dataset_names_the_argument_and_the_fix(monkeypatch):
    def not_on_the_hub(name, config=None, cache_dir=None):
        raise datasets.exceptions.DatasetNotFoundError(
            f"Dataset '{name}' doesn't exist on the Hub or cannot be accessed."
        )

    monkeypatch.setattr(datasets, "load_dataset", not_on_the_hub)
    with pytest.raises(FileNotFoundError, match=r"dataset_name='nobody/dogs' is neither .* Check the id"):
        load_image_datasets(dataset_name="nobody/dogs")
