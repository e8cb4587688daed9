"""vit_ft.tools.fewshot.data: train and test splits of image folders and of a saved dataset."""

import shutil

import numpy as np
import pytest

from vit_ft.tools.fewshot.data import FewShotSource, load_fewshot_data


def test_load_fewshot_data_reads_train_and_test_and_refuses_a_missing_split(small_digits, tmp_path):
    data = load_fewshot_data(small_digits)
    assert data.names == ["0", "1", "2"]
    assert (
        np.bincount(data.train_labels).tolist() == [12] * 3
        and np.bincount(data.test_labels).tolist() == [4] * 3
    )
    shutil.copytree(small_digits / "train", tmp_path / "only_train" / "train")
    with pytest.raises(FileNotFoundError, match="has no test/ folder"):
        load_fewshot_data(tmp_path / "only_train")


def test_load_fewshot_data_reads_a_saved_dataset_by_split_and_column(small_digits, tmp_path):
    import datasets

    def split(name: str) -> dict:
        paths = sorted((small_digits / name).glob("*/*.png"))
        return {"img": [str(p) for p in paths], "label": [int(p.parent.name) for p in paths]}

    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["0", "1", "2"])}
    )
    saved = datasets.DatasetDict(
        {name: datasets.Dataset.from_dict(split(name), features=features) for name in ("train", "test")}
    )
    saved.save_to_disk(tmp_path / "saved")
    data = load_fewshot_data(FewShotSource(tmp_path / "saved", image_column="img"))
    assert data.names == ["0", "1", "2"] and len(data.train_labels) == 36 and len(data.test_labels) == 12
    assert np.array_equal(np.bincount(data.test_labels), [4, 4, 4])
    with pytest.raises(
        KeyError, match="test_split='val' is not a split .* available splits: \\['test', 'train'\\]"
    ):
        load_fewshot_data(FewShotSource(tmp_path / "saved", test_split="val", image_column="img"))
