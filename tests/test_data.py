import io
import logging
import shutil
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFile

from vit_ft import data as data_module
from vit_ft.data import (
    build_transforms,
    collate_fn,
    drop_bad_images,
    find_bad_images,
    load_image_datasets,
    write_digits_imagefolder,
)
from vit_ft.images import random_resized_crop, to_normalized_tensor

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth RGB test image with a few shapes, different for each seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 128, size=3)
    rgb = base + np.stack([x * 100 // max(width, 1), y * 100 // max(height, 1), (x + y) % 50], axis=-1)
    img = Image.fromarray(rgb.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.ellipse(
        (width // 4, height // 4, width // 2, height // 2),
        fill=tuple(int(v) for v in rng.integers(0, 256, 3)),
    )
    return img


def encoded(img: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def normalise(array: np.ndarray) -> np.ndarray:
    """Manual reference: (height, width, 3) uint8 -> (3, height, width) normalised float32."""
    return (
        ((array.astype(np.float32) / 255 - np.array(MEAN)) / np.array(STD))
        .astype(np.float32)
        .transpose(2, 0, 1)
    )


def make_folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (12, 10), seed: int = 0) -> Path:
    """root/<class>/<i>.png with counts[class] images each."""
    for k, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            photo(*size, seed=seed + 100 * k + i).save(root / name / f"{i}.png")
    return root


# ---- transforms ----------------------------------------------------------------------------------------


def test_eval_transform_normalises_like_numpy():
    img = photo(32, 24)
    transform = build_transforms((24, 32), MEAN, STD, train=False)  # target == image size: no resampling
    out = transform({"image": [img], "label": [3]})
    pixels = out["pixel_values"][0]
    assert pixels.shape == (3, 24, 32) and pixels.dtype == torch.float32
    assert np.allclose(pixels.numpy(), normalise(np.asarray(img)), atol=1e-5)
    assert out["labels"] == [3]


def test_eval_transform_resizes_shorter_side_then_center_crops():
    img = photo(90, 60)
    out = build_transforms(30, MEAN, STD, train=False)({"image": [img], "label": [0]})["pixel_values"][0]
    manual = img.resize((45, 30), Image.Resampling.BICUBIC).crop((8, 0, 38, 30))  # round((45 - 30) / 2) = 8
    assert np.allclose(out.numpy(), normalise(np.asarray(manual)), atol=1e-5)


def test_eval_transform_gives_same_result_for_pil_and_undecoded_inputs(tmp_path: Path):
    img = photo(50, 40)
    path = tmp_path / "a.png"
    img.save(path)
    transform = build_transforms((16, 20), MEAN, STD, train=False)
    sources = [
        img,
        {"bytes": None, "path": str(path)},
        {"bytes": path.read_bytes(), "path": "a.png"},
        str(path),
    ]
    outputs = transform({"image": sources, "label": [1, 1, 1, 1]})["pixel_values"]
    for output in outputs[1:]:
        assert torch.equal(output, outputs[0])


def test_train_transform_is_random_but_seeded():
    img = photo(64, 48)
    transform = build_transforms(16, MEAN, STD, train=True)
    batch = {"image": [img] * 4, "label": [0] * 4}
    torch.manual_seed(0)
    first = torch.stack(transform(batch)["pixel_values"])
    torch.manual_seed(0)
    again = torch.stack(transform(batch)["pixel_values"])
    assert torch.equal(first, again)
    assert not torch.equal(first[0], first[1])  # four draws from one image differ
    assert first.shape == (4, 3, 16, 16)


def test_train_transform_flips_only_when_enabled():
    # A left-to-right ramp: a flip reverses it, so a flipped crop has pixel values falling along x.
    img = Image.fromarray(np.tile(np.arange(0, 256, 2, dtype=np.uint8)[None, :, None], (64, 1, 3)))

    def slopes(flip: bool) -> set[bool]:
        torch.manual_seed(0)
        transform = build_transforms(8, MEAN, STD, train=True, crop_scale=(0.5, 1.0), horizontal_flip=flip)
        crops = transform({"image": [img] * 20, "label": [0] * 20})["pixel_values"]
        return {bool(crop[0, 4, -1] > crop[0, 4, 0]) for crop in crops}

    assert slopes(flip=False) == {True}
    assert slopes(flip=True) == {True, False}


@pytest.mark.parametrize("train", [True, False])
def test_transforms_support_non_square_targets(train):
    transform = build_transforms((24, 40), MEAN, STD, train=train)
    for size in [(100, 50), (50, 100), (40, 24), (10, 10)]:
        out = transform({"image": [photo(*size)], "label": [0]})["pixel_values"][0]
        assert out.shape == (3, 24, 40)


@pytest.mark.parametrize(
    ("img", "fmt"),
    [
        (Image.new("RGBA", (40, 30), (60, 60, 60, 255)), "PNG"),
        (Image.new("L", (40, 30), 60), "PNG"),
        (Image.new("RGB", (40, 30), (60, 60, 60)).convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        (Image.new("CMYK", (40, 30), (195, 195, 195, 0)), "TIFF"),
        (Image.new("CMYK", (40, 30), (195, 195, 195, 0)), "JPEG"),
        (Image.fromarray(np.full((30, 40), 60 * 257, dtype=np.uint16)), "PNG"),
    ],
    ids=["RGBA", "L", "P", "CMYK-tiff", "CMYK-jpeg", "16-bit"],
)
@pytest.mark.parametrize("train", [True, False])
def test_transforms_turn_every_mode_into_three_channels(img, fmt, train):
    value = {"bytes": encoded(img, fmt), "path": None}
    out = build_transforms(16, MEAN, STD, train=train)({"image": [value], "label": [0]})["pixel_values"][0]
    assert out.shape == (3, 16, 16)
    expected = torch.tensor([(60 / 255 - m) / s for m, s in zip(MEAN, STD, strict=True)]).view(3, 1, 1)
    assert torch.allclose(out, expected.expand_as(out), atol=2 / 255 / min(STD))


def test_transform_decodes_big_jpegs_at_reduced_size(monkeypatch):
    value = {"bytes": encoded(photo(1600, 1200), "JPEG", quality=90), "path": "big.jpg"}
    decoded_sizes = []
    real_load = ImageFile.ImageFile.load

    def spy(self):
        decoded_sizes.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    eval_out = build_transforms(100, MEAN, STD, train=False)({"image": [value], "label": [0]})
    assert decoded_sizes[0] == (200, 150)  # eval needs a 100-pixel shorter side: 1/8 scale
    torch.manual_seed(0)
    train = build_transforms(100, MEAN, STD, train=True, horizontal_flip=False)
    for _ in range(10):
        decoded_sizes.clear()
        train_out = train({"image": [value], "label": [0]})
        # train decodes for the crop it drew: at least 1/2 scale here, as every crop is >= 200 px wide
        assert decoded_sizes[0][0] <= 800, decoded_sizes
    assert eval_out["pixel_values"][0].shape == train_out["pixel_values"][0].shape == (3, 100, 100)


def test_train_transform_is_the_random_resized_crop_of_vit_ft_images():
    value = {"bytes": encoded(photo(640, 480), "JPEG", quality=90), "path": "photo.jpg"}
    transform = build_transforms((48, 64), MEAN, STD, train=True, horizontal_flip=False)
    torch.manual_seed(5)
    out = transform({"image": [value], "label": [0]})["pixel_values"][0]
    torch.manual_seed(5)
    expected = to_normalized_tensor(random_resized_crop(value, (48, 64)), MEAN, STD)
    assert torch.equal(out, expected)


def test_transform_survives_a_bad_file(caplog):
    transform = build_transforms(8, MEAN, STD, train=True)
    good = {"bytes": encoded(photo(20, 20)), "path": "good.png"}
    bad = {"bytes": b"\xff\xd8 not really a jpeg", "path": "broken.jpg"}
    with caplog.at_level(logging.WARNING, logger="vit_ft.data"):
        out = transform({"image": [good, bad], "label": [4, 5]})
    assert out["labels"] == [4, 5]
    assert torch.equal(out["pixel_values"][1], torch.zeros(3, 8, 8))
    assert not torch.equal(out["pixel_values"][0], torch.zeros(3, 8, 8))
    assert "broken.jpg" in caplog.text and "drop_bad_images" in caplog.text


def test_transform_explains_a_missing_image_column():
    with pytest.raises(KeyError, match="remove_unused_columns=False"):
        build_transforms(8, MEAN, STD, train=False)({"label": [0]})


def test_build_transforms_rejects_bad_arguments():
    with pytest.raises(ValueError, match="3 values"):
        build_transforms(8, [0.5], [0.5], train=False)
    with pytest.raises(ValueError, match="crop_scale"):
        build_transforms(8, MEAN, STD, train=True, crop_scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="crop_pct"):
        build_transforms(8, MEAN, STD, train=False, crop_pct=1.5)


def test_transform_and_collate_work_with_datasets_and_decode_false():
    images = [photo(30, 20, seed=i) for i in range(5)]
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": [0, 1, 2, 0, 1]},
        features=datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
        ),
    )
    transform = build_transforms((12, 16), MEAN, STD, train=False)
    decoded = ds.with_transform(transform)
    undecoded = ds.cast_column("image", datasets.Image(decode=False)).with_transform(transform)
    batch = collate_fn([decoded[i] for i in range(5)])
    assert batch["pixel_values"].shape == (5, 3, 12, 16) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [0, 1, 2, 0, 1]
    assert torch.equal(collate_fn([undecoded[i] for i in range(5)])["pixel_values"], batch["pixel_values"])
    loader = torch.utils.data.DataLoader(undecoded, batch_size=2, collate_fn=collate_fn)
    assert [tuple(b["pixel_values"].shape) for b in loader] == [
        (2, 3, 12, 16),
        (2, 3, 12, 16),
        (1, 3, 12, 16),
    ]


def test_collate_without_labels():
    examples = [{"pixel_values": torch.zeros(3, 4, 4)}, {"pixel_values": torch.ones(3, 4, 4)}]
    batch = collate_fn(examples)
    assert set(batch) == {"pixel_values"} and batch["pixel_values"].shape == (2, 3, 4, 4)


# ---- bad files -----------------------------------------------------------------------------------------


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
    assert data_module.load_image(good_jpeg, min_size=1).size == (150, 113)
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


# ---- loading -------------------------------------------------------------------------------------------


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


# ---- digits --------------------------------------------------------------------------------------------


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
