"""Tests for vit_ft.data.multilabel: multi-label columns and folders become multi-hot vectors with the right
names, every mistake is one line naming it, and the hold-out keeps every label in both parts."""

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from vit_ft.data.label_files import labels_file, read_labelled_folder
from vit_ft.data.multilabel import (
    data_report,
    label_kind,
    multi_hot_matrix,
    multi_label_names,
    split_multilabel,
    stratified_hold_out,
    to_multi_hot,
)

NAMES = ["cat", "dog", "grass"]


def _features(label: object) -> datasets.Features:
    return datasets.Features({"image": datasets.Value("string"), "label": label})


@pytest.mark.parametrize(
    ("feature", "kind"),
    [
        (datasets.ClassLabel(names=NAMES), "single"),
        (datasets.Value("int64"), "single"),
        (datasets.Value("string"), "single"),
        (datasets.Sequence(datasets.ClassLabel(names=NAMES)), "multi"),
        (datasets.List(datasets.Value("float32"), length=3), "multi"),
        (datasets.LargeList(datasets.Value("int8")), "multi"),
        (datasets.List(datasets.Value("string")), "multi"),
    ],
)
def test_label_kind(feature, kind):
    assert label_kind(_features(feature), "label") == kind


@pytest.mark.parametrize(
    "feature", [datasets.Value("float32"), datasets.List(datasets.List(datasets.Value("int64")))]
)
def test_label_column_of_wrong_type_is_one_line_naming_it(feature):
    with pytest.raises(ValueError, match=r"label_column='label' holds .*; accepted: one label") as error:
        label_kind(_features(feature), "label")
    assert "\n" not in str(error.value)
    with pytest.raises(KeyError, match="available columns"):
        label_kind(_features(feature), "tags")


def test_sequence_of_classlabel_to_multi_hot():
    rows = [[0, 2], [], [1], [2, 1, 0]]
    train = datasets.Dataset.from_dict(
        {"image": ["a", "b", "c", "d"], "label": rows},
        features=_features(datasets.Sequence(datasets.ClassLabel(names=NAMES))),
    )
    names = multi_label_names(train, "label")
    assert names == NAMES
    converted = to_multi_hot(train, "label", names)
    assert converted.features["label"] == datasets.List(datasets.Value("float32"), length=3)
    expected = np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]], dtype=np.float32)
    np.testing.assert_array_equal(multi_hot_matrix(converted), expected)
    assert converted["image"] == ["a", "b", "c", "d"]
    # another split whose ClassLabel lists the names in another order is matched by name
    other = datasets.Dataset.from_dict(
        {"image": ["e"], "label": [[0]]},
        features=_features(datasets.Sequence(datasets.ClassLabel(names=["grass", "cat", "dog"]))),
    )
    np.testing.assert_array_equal(multi_hot_matrix(to_multi_hot(other, "label", names)), [[0, 0, 1]])


def test_name_lists_and_multi_hot_lists_to_multi_hot():
    named = datasets.Dataset.from_dict({"image": ["a", "b"], "label": [["dog", "cat"], []]})
    names = multi_label_names(named, "label")
    assert names == ["cat", "dog"]
    np.testing.assert_array_equal(multi_hot_matrix(to_multi_hot(named, "label", names)), [[1, 1], [0, 0]])
    hot = datasets.Dataset.from_dict({"image": ["a", "b"], "label": [[0, 1, 1], [1, 0, 0]]})
    assert multi_label_names(hot, "label") == ["0", "1", "2"]
    assert multi_label_names(hot, "label", NAMES) == NAMES
    np.testing.assert_array_equal(multi_hot_matrix(to_multi_hot(hot, "label", NAMES)), hot["label"])


@pytest.mark.parametrize(
    ("rows", "names", "message"),
    [
        ([[0, 1, 0], [3, 7]], NAMES, "not a multi-hot 0/1 vector of length 3"),
        ([[0, 1, 0], [0, 1]], NAMES, "not a multi-hot 0/1 vector of length 3"),
        ([["cat"], ["horse"]], ["cat", "dog"], r"label\(s\) \['horse'\] that are not among the training"),
    ],
)
def test_bad_multi_label_values_are_one_line(rows, names, message):
    dataset = datasets.Dataset.from_dict({"image": ["x"] * len(rows), "label": rows})
    with pytest.raises(ValueError, match=message) as error:
        to_multi_hot(dataset, "label", names, where="split 'train'")
    assert "\n" not in str(error.value) and "split 'train' row 1" in str(error.value)


def test_single_label_column_is_not_converted():
    single = datasets.Dataset.from_dict({"image": ["x"], "label": [1]})
    with pytest.raises(ValueError, match="one label per image; multi-label classification needs several"):
        to_multi_hot(single, "label", NAMES)


def _image(path: Path, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 4, 3), value, dtype=np.uint8)).save(path)


def _folder(root: Path, text: str, name: str = "labels.csv", images=("a.png", "b.png", "sub/c.png")) -> Path:
    for i, image in enumerate(images):
        _image(root / image, 40 * i)
    (root / name).write_text(text, encoding="utf-8")
    return root


def test_labels_csv_folder(tmp_path):
    root = _folder(tmp_path / "f", "file,labels\na.png,dog;cat\nb.png,\nsub/c.png, grass \n")
    dataset, names = read_labelled_folder(root)
    assert names == NAMES  # sorted
    np.testing.assert_array_equal(multi_hot_matrix(dataset), [[1, 1, 0], [0, 0, 0], [0, 0, 1]])
    assert isinstance(dataset.features["image"], datasets.Image)
    assert np.asarray(dataset[2]["image"])[0, 0, 0] == 80  # sub/c.png, in the file's row order
    jsonl = "\n".join(
        json.dumps(r)
        for r in (
            {"file": "a.png", "labels": ["dog", "cat"]},
            {"file": "b.png", "labels": []},
            {"file_name": "sub/c.png", "labels": ["grass"]},
        )
    )
    same, same_names = read_labelled_folder(_folder(tmp_path / "j", jsonl + "\n", "labels.jsonl"))
    assert same_names == names
    np.testing.assert_array_equal(multi_hot_matrix(same), multi_hot_matrix(dataset))
    spaces = _folder(tmp_path / "s", "file,labels\na.png,dog cat\nb.png,\nsub/c.png,grass\n")
    assert read_labelled_folder(spaces, separator=" ")[1] == NAMES
    assert read_labelled_folder(spaces)[1] == ["dog cat", "grass"]  # ";" keeps "traffic light" whole


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("file,labels\na.png,dog\nb.png,cat\nsub/c.png,\nd.png,dog\n", FileNotFoundError, "line 5 names 'd.png'"),
        ("file,labels\na.png,dog\nb.png,cat\nsub/c.png,\na.png,cat\n", ValueError, r"'a.png' twice \(lines 2 and 5\)"),
        ("file,labels\na.png,dog;;cat\nb.png,cat\nsub/c.png,\n", ValueError, "line 2: 'a.png' has an empty label"),
        ("file,labels\na.png,dog\nb.png,cat\n", ValueError, r"1 image\(s\) .* not listed in labels.csv, e.g. 'sub/c.png'"),
        ("file,labels\na.png,dog\nb.png,cat\nsub/c.png,\n../x.png,dog\n", ValueError, "must be a path inside"),
        ("image,tags\na.png,dog\n", ValueError, "must name the columns file,labels"),
        ("file,labels\na.png,dog\nb.png,dog\nsub/c.png,\n", ValueError, r"1 label\(s\) \['dog'\]; .* at least two"),
    ],
)  # fmt: skip
def test_labels_csv_mistakes_are_one_line(tmp_path, text, error, message):
    root = _folder(tmp_path / "f", text)
    with pytest.raises(error, match=message) as raised:
        read_labelled_folder(root)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"file": "a.png", "labels": ["dog", ""]}', "invalid label ''"),
        ('{"file": "a.png", "labels": "dog"}', r'expected \{"file"'),
        ('{"file": "a.png", "labels": [null]}', "invalid label None"),
        ("a.png dog", "line 1 is not JSON"),
    ],
)
def test_labels_jsonl_mistakes_are_one_line(tmp_path, line, message):
    root = _folder(tmp_path / "j", line + "\n", "labels.jsonl", images=("a.png",))
    with pytest.raises(ValueError, match=message) as raised:
        read_labelled_folder(root)
    assert "\n" not in str(raised.value)


def test_folder_source_mistakes(tmp_path):
    root = _folder(tmp_path / "f", "file,labels\na.png,dog\nb.png,cat\nsub/c.png,\n")
    assert labels_file(root) == root / "labels.csv" and labels_file(tmp_path) is None
    (root / "labels.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds both labels.csv and labels.jsonl"):
        read_labelled_folder(root)
    with pytest.raises(FileNotFoundError, match="validation_dir="):
        read_labelled_folder(tmp_path / "absent", argument="validation_dir")
    validation = _folder(tmp_path / "v", "file,labels\na.png,horse\n", images=("a.png",))
    with pytest.raises(ValueError, match=r"\['horse'\] that are not among the training labels"):
        read_labelled_folder(validation, argument="validation_dir", names=["cat", "dog"])


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("labels.csv", "file,labels\na.png,dog\nb.png,horse\n", 3),  # the header is line 1
        ("labels.csv", 'file,labels\n"a.png","dog;cat"\n\nb.png,horse\n', 4),  # a blank line counts
        ("labels.jsonl", '{"file": "a.png", "labels": ["dog"]}\n\n{"file": "b.png", "labels": ["horse"]}\n', 3),
    ],
)
def test_a_label_outside_the_training_labels_names_the_file_and_its_line(tmp_path, name, text, line):
    """Counted as an editor counts the file's lines (not from 0, not the row's index), the file named."""
    folder = _folder(tmp_path / "v", text, name, images=("a.png", "b.png"))
    with pytest.raises(ValueError) as raised:
        read_labelled_folder(folder, argument="validation_dir", names=["cat", "dog"])
    assert str(raised.value).startswith(f"{folder / name} line {line} has label(s) ['horse']")


def _sparse_labels(seed: int, n: int = 120) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = rng.random((n, 6)) < np.array([0.4, 0.25, 0.1, 0.05, 0.0, 0.0])
    labels[rng.choice(n, 2, replace=False), 4] = True  # a label on two images only
    labels[rng.choice(n, 3, replace=False), 5] = True
    return labels.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hold_out_keeps_every_label_in_both_parts(seed):
    labels = _sparse_labels(seed)
    train, validation = stratified_hold_out(labels, 0.1, seed)
    assert np.array_equal(np.sort(np.r_[train, validation]), np.arange(len(labels)))
    assert (labels[train].sum(0) > 0).all() and (labels[validation].sum(0) > 0).all()
    assert abs(len(validation) - 12) <= 3
    again = stratified_hold_out(labels, 0.1, seed)
    assert np.array_equal(again[1], validation)  # seeded


def test_hold_out_repairs_what_iterative_stratification_leaves_out():
    from iterstrat.ml_stratifiers import MultilabelStratifiedShuffleSplit

    labels = _sparse_labels(0)
    splitter = MultilabelStratifiedShuffleSplit(n_splits=1, test_size=0.1, random_state=0)
    _, held = next(splitter.split(np.zeros(len(labels)), labels))
    assert not labels[held, 4].any()  # iterative stratification alone: the 2-image label all in train
    _, validation = stratified_hold_out(labels, 0.1, 0)
    assert labels[validation, 4].sum() == 1


def test_hold_out_single_positive_and_bad_fraction():
    labels = np.zeros((20, 2), dtype=np.float32)
    labels[:10, 0] = 1
    labels[3, 1] = 1  # one image only: it cannot be in both parts
    train, validation = stratified_hold_out(labels, 0.2, 0)
    assert labels[train, 0].any() and labels[validation, 0].any()
    with pytest.raises(ValueError, match="must be a fraction in"):
        stratified_hold_out(labels, 1.0, 0)
    with pytest.raises(ValueError, match="Cannot hold out"):
        stratified_hold_out(labels[:1], 0.5, 0)


def test_split_multilabel_and_data_report():
    hot = _sparse_labels(1, n=40)
    dataset = datasets.Dataset.from_dict(
        {"image": [str(i) for i in range(40)], "label": list(hot)},
        features=_features(datasets.List(datasets.Value("float32"), length=6)),
    )
    train, validation = split_multilabel(dataset, 0.25, 0)
    assert len(train) + len(validation) == 40
    assert not set(train["image"]) & set(validation["image"])
    names = [f"l{j}" for j in range(6)]
    report = data_report(
        {"train": multi_hot_matrix(train), "validation": multi_hot_matrix(validation)}, names
    )
    rows = {line.split()[0]: line.split()[1:] for line in report.splitlines()[1:8]}
    for j, name in enumerate(names):
        assert [int(v) for v in rows[name]] == [
            int(multi_hot_matrix(s)[:, j].sum()) for s in (train, validation)
        ]
    all_negative = [int((multi_hot_matrix(s).sum(1) == 0).sum()) for s in (train, validation)]
    assert [int(v) for v in rows["all-negative"]] == all_negative and sum(all_negative) > 0
    assert multi_hot_matrix(dataset.select([])).shape == (0, 6)
    absent = data_report({"test": np.array([[1, 0], [0, 0]])}, ["a", "b"])
    assert "test: no positive image of ['b']" in absent
