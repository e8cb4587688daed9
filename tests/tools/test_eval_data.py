"""Tests for vit_ft.tools.evaluate.data: an image folder's classes map to the model's label ids, and seeded subsets."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_ft.tools.evaluate.data import data_from_fields, folder_eval_data

CLASSES = {"ant": 3, "bee": 5, "wasp": 4}  # class folder -> number of images


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval_folder")
    rng = np.random.default_rng(0)
    for name, count in CLASSES.items():
        (root / name).mkdir()
        for i in range(count):
            pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{name}_{i}.png")
    return root


def paths(data) -> list[str]:
    return [Path(image["path"]).name for image in data.dataset["image"]]


def test_class_names_map_to_the_models_label_ids(folder):
    id2label = {0: "wasp", 1: "ant", 2: "bee", 3: "moth"}  # another order than the folders', plus a class
    data = folder_eval_data(folder, id2label)
    assert len(data) == sum(CLASSES.values()) and data.labels.dtype == np.int64
    for name, label in zip(paths(data), data.labels, strict=True):
        assert id2label[int(label)] == name.split("_")[0], name
    assert data.description == f"image folder {folder}"


def test_a_class_the_model_does_not_know_is_named(folder):
    with pytest.raises(ValueError, match=r"\['wasp'\] that the model does not know.*Rename or remove"):
        folder_eval_data(folder, {0: "ant", 1: "bee"})


def test_max_samples_takes_a_subset_that_repeats_for_the_seed(folder):
    id2label = dict(enumerate(CLASSES))
    first = folder_eval_data(folder, id2label, 5, seed=3)
    again = folder_eval_data(folder, id2label, 5, seed=3)
    assert len(first) == 5 and paths(first) == paths(again)
    assert (first.labels == again.labels).all()
    assert first.description.endswith("(5 random images, seed 3)")
    assert set(paths(first)) < set(paths(folder_eval_data(folder, id2label)))
    assert paths(folder_eval_data(folder, id2label, 5, seed=4)) != paths(first)
    everything = folder_eval_data(folder, id2label, 100, seed=3)  # more than there are: all of them
    assert len(everything) == sum(CLASSES.values()) and "random" not in everything.description


def test_recorded_fields_give_the_test_split_and_its_seeded_subset(folder):
    fields = {"train_dir": str(folder), "test_dir": str(folder), "validation_split_percentage": 0}
    id2label = dict(enumerate(CLASSES))
    data = data_from_fields(fields, id2label, None, 7, "the record", max_samples=4)
    assert data.description == f"split 'test' of {folder} (the record, seed 7), 4 random images"
    assert paths(data) == paths(data_from_fields(fields, id2label, "test", 7, "the record", max_samples=4))
    with pytest.raises(
        ValueError, match=r"the record has no 'validation' split; its splits are \['test', 'train'\]"
    ):
        data_from_fields(fields, id2label, "validation", 7, "the record")


def test_one_class_is_enough_to_evaluate(folder, tmp_path):
    """Evaluation needs only the model's classes: a folder of one class is evaluated, not refused as if it
    were training data (a classifier to train needs two)."""
    one = tmp_path / "one"
    (one / "bee").mkdir(parents=True)
    for image in (folder / "bee").iterdir():
        (one / "bee" / image.name).write_bytes(image.read_bytes())
    data = folder_eval_data(one, {0: "ant", 1: "bee"})
    assert data.labels.tolist() == [1] * CLASSES["bee"]
    (one / "bee").rename(one / ".bee")  # hidden: no class folder is left
    with pytest.raises(FileNotFoundError, match="holds no image files"):
        folder_eval_data(one, {0: "ant", 1: "bee"})


def test_images_only_match_no_label(folder):
    """`id2label=None` (inspect): the images of a folder whose classes the model does not know, no labels."""
    data = folder_eval_data(folder, None)
    assert data.labels is None and not data.multi_label and len(data) == sum(CLASSES.values())
