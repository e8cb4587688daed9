"""Tests for vit_ft.data.transforms: the train/eval transforms match a manual reference, survive bad files, and
collate into batches."""

import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from vit_ft.data.collate import collate_fn
from vit_ft.data.images import to_normalized_tensor
from vit_ft.data.random_crops import random_resized_crop
from vit_ft.data.transforms import INDEX_COLUMN, augmentation_seed, build_transforms

from ..sample_images import encoded, photo

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


def normalise(array: np.ndarray) -> np.ndarray:
    """Manual reference: (height, width, 3) uint8 -> (3, height, width) normalised float32."""
    return (
        ((array.astype(np.float32) / 255 - np.array(MEAN)) / np.array(STD))
        .astype(np.float32)
        .transpose(2, 0, 1)
    )


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
    manual = img.resize((45, 30), Image.Resampling.BICUBIC).crop((7, 0, 37, 30))  # (45 - 30) // 2, transformers'
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


def seeded_batch(indices: list[int], epoch: int, seed: int = 3, flip: bool = True) -> torch.Tensor:
    """The seeded train transform's output for photos 0..7 at `indices`, drawn in that order."""
    images = [{"bytes": encoded(photo(40, 30, seed=i)), "path": f"{i}.png"} for i in range(8)]
    transform = build_transforms(16, MEAN, STD, train=True, horizontal_flip=flip, seed=seed)
    transform.set_epoch(epoch)
    batch = {"image": [images[i] for i in indices], "label": [0] * len(indices), INDEX_COLUMN: indices}
    return torch.stack(transform(batch)["pixel_values"])


def test_seeded_train_transform_depends_only_on_seed_epoch_and_index():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    whole = seeded_batch(list(range(8)), epoch=1)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is left alone
    # what a resumed run or another process sees: the same samples alone, in another order, after other draws
    torch.rand(100)
    assert torch.equal(seeded_batch([5, 2], epoch=1), whole[[5, 2]])
    assert not torch.equal(seeded_batch([5, 2], epoch=2), whole[[5, 2]])
    assert not torch.equal(seeded_batch([5, 2], epoch=1, seed=4), whole[[5, 2]])
    # the draws are those of a generator seeded by augmentation_seed
    transform = build_transforms(16, MEAN, STD, train=True, seed=3)
    image = {"bytes": encoded(photo(40, 30, seed=5)), "path": "5.png"}
    generator = torch.Generator().manual_seed(augmentation_seed(3, 1, 5))
    assert torch.equal(transform.transform_image(image, generator), whole[5])


def test_augmentation_seeds_are_distinct_and_fit_a_generator():
    seeds = {
        augmentation_seed(seed, epoch, index)
        for seed in (0, 1)
        for epoch in range(10)
        for index in range(500)
    }
    assert len(seeds) == 2 * 10 * 500
    assert all(0 <= seed < 2**32 for seed in seeds)  # all of it reaches torch's CPU generator
    assert augmentation_seed(0, 1, 2) == augmentation_seed(0, 1, 2)


def test_set_epoch_needs_a_seeded_train_transform():
    with pytest.raises(ValueError, match="seed"):
        build_transforms(8, MEAN, STD, train=True).set_epoch(1)
    with pytest.raises(ValueError, match="seed"):
        build_transforms(8, MEAN, STD, train=False, seed=1).set_epoch(1)


@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_workers_draw_the_epoch_set_in_the_main_process(persistent):
    """Workers copy the dataset with its transform when they start (persistent ones once): the epoch set before
    each epoch's iterator must reach them, and the crops must not depend on the number of workers."""
    images = [{"bytes": encoded(photo(40, 30, seed=i)), "path": f"{i}.png"} for i in range(8)]
    rows = {"image": images, "label": [0] * 8, INDEX_COLUMN: list(range(8))}
    dataset = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image(decode=False))
    transform = build_transforms(16, MEAN, STD, train=True, seed=3)
    dataset.set_transform(transform)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, num_workers=2, persistent_workers=persistent, collate_fn=collate_fn
    )
    for epoch in (0, 1, 2):
        transform.set_epoch(epoch)
        in_workers = torch.cat([batch["pixel_values"] for batch in loader])
        assert torch.equal(in_workers, seeded_batch(list(range(8)), epoch, flip=True)), epoch


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


def test_eval_transform_survives_a_bad_file(caplog):
    """(train: the image is skipped by the collator, tests/data/test_bad_images.py)"""
    transform = build_transforms(8, MEAN, STD, train=False)
    good = {"bytes": encoded(photo(20, 20)), "path": "good.png"}
    bad = {"bytes": b"\xff\xd8 not really a jpeg", "path": "broken.jpg"}
    with caplog.at_level(logging.WARNING, logger="vit_ft.data.datasets"):
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
