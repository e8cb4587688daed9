"""vit_ft.data.batch_augmentation: the workers' uint8 crops, then flip, RandAugment / TrivialAugment / colour
jitter, normalisation, random erasing and mixup per batch, each image its own draws, as timm; kornia's batched
call as the reference for each op's parameters."""

import pickle

import pytest
import torch
from PIL import Image

from vit_ft.data.augmentation import TIMM_RAND_OPS, AugmentationSpec
from vit_ft.data.bad_images import BadImage
from vit_ft.data.batch_augmentation import BatchAugmentation, _op_value
from vit_ft.data.mixup import MixupCutmix
from vit_ft.data.transforms import INDEX_COLUMN, build_transforms

from ..sample_images import encoded, photo

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
STRONG = AugmentationSpec("randaugment", 2, 9, random_erasing_prob=0.5, random_erasing_mode="pixel")
SPECS = [
    None,
    STRONG,
    AugmentationSpec("trivialaugment", random_erasing_prob=0.5),
    AugmentationSpec(color_jitter=0.4, random_erasing_prob=0.5, random_erasing_mode="rand"),
]


def augmentation(spec=None, seed=3, flip=True, mixup=None, size=16) -> BatchAugmentation:
    transform = build_transforms(
        size, MEAN, STD, train=True, seed=seed, augmentation=spec, horizontal_flip=flip, device_augmentation=True
    )
    return BatchAugmentation(transform, mixup)


def crops(count: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def batch_of(pixels: torch.Tensor, indices) -> dict[str, torch.Tensor]:
    return {"pixel_values": pixels, "labels": torch.zeros(len(pixels), dtype=torch.long), INDEX_COLUMN: torch.tensor(indices)}


def rows(count=4):
    images = [{"bytes": encoded(photo(48, 36, seed=i)), "path": f"{i}.png"} for i in range(count)]
    return {"image": images, "label": [0] * count, INDEX_COLUMN: list(range(count))}


def test_worker_path_returns_uint8_crops_that_normalise_to_the_float_path():
    """Without flip or augmentation the device path's output is the worker path's, bit for bit, at a quarter of
    the bytes per image across the worker boundary."""
    worker = build_transforms(16, MEAN, STD, train=True, seed=3, horizontal_flip=False)
    device = build_transforms(16, MEAN, STD, train=True, seed=3, horizontal_flip=False, device_augmentation=True)
    for transform in (worker, device):
        transform.set_epoch(2)
    expected = torch.stack(worker(rows())["pixel_values"])
    out = device(rows())
    assert out[INDEX_COLUMN] == [0, 1, 2, 3]
    uint8 = torch.stack(out["pixel_values"])
    assert uint8.dtype == torch.uint8 and uint8.shape == expected.shape
    assert uint8.element_size() * uint8[0].numel() * 4 == expected.element_size() * expected[0].numel()
    augment = BatchAugmentation(device)
    augment.set_epoch(2)
    got = augment(augment.collate([{k: v[i] for k, v in out.items()} for i in range(4)]))
    assert torch.equal(got["pixel_values"], expected)
    assert INDEX_COLUMN not in got and got["pixel_values"].dtype == torch.float32


def test_device_transform_marks_a_bad_image_for_the_collator_to_skip():
    """The train transform leaves a bad image as a `BadImage` (the training collator drops it and the run counts
    it: vit_ft.data.bad_images), on the device path as on the worker path."""
    device = build_transforms(8, MEAN, STD, train=True, device_augmentation=True)
    good = torch.zeros(8, 8, 3, dtype=torch.uint8).numpy()
    out = device({"image": [{"bytes": b"not an image", "path": "bad.jpg"}, Image.fromarray(good)], "label": [0, 1]})
    bad, crop = out["pixel_values"]
    assert isinstance(bad, BadImage) and "bad.jpg" in str(bad.source)
    assert crop.dtype == torch.uint8 and crop.shape == (3, 8, 8)


@pytest.mark.parametrize("spec", SPECS)
def test_each_image_draws_alone_whatever_its_batch(spec, monkeypatch):
    """Image i's output is a function of (seed, epoch, index) only: the same alone, in another batch, in
    another order; the global RNGs (dropout's, on the CPU and on a GPU) are left alone."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))  # torch.manual_seed's
    augment = augmentation(spec)
    augment.set_epoch(1)
    pixels = crops(8)
    state = torch.get_rng_state()
    whole = augment(batch_of(pixels, range(8)))["pixel_values"]
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(augment(batch_of(pixels[[5, 2]], [5, 2]))["pixel_values"], whole[[5, 2]])
    assert torch.equal(augment(batch_of(pixels[3:4], [3]))["pixel_values"][0], whole[3])
    augment.set_epoch(2)
    assert not torch.equal(augment(batch_of(pixels, range(8)))["pixel_values"], whole)
    other_seed = augmentation(spec, seed=4)
    other_seed.set_epoch(1)
    assert not torch.equal(other_seed(batch_of(pixels, range(8)))["pixel_values"], whole)
    assert reseeded == []


def test_two_images_of_one_batch_get_different_ops():
    """kornia's batched RandAugment draws one op sequence for the whole batch; here each image draws its own
    ops, signs and whether each applies (timm's per-image RandAugment)."""
    augment = augmentation(STRONG)
    kornia_ops = augment.ops.pixel_ops
    params = kornia_ops.forward_parameters(torch.Size([8, 3, 16, 16]))
    assert len(params) == 2  # n ops for all 8 images: one sequence per batch
    draws = augment.draws(torch.arange(64), 64)
    layout = augment._layout
    ops = (draws[:, layout["op"]] * len(TIMM_RAND_OPS)).long()
    assert len({tuple(row) for row in ops.tolist()}) > 30  # 64 images: many different op pairs
    applied = draws[:, layout["apply"]] < 0.5
    assert 0.35 < applied.float().mean() < 0.65  # each drawn op applies half the time (timm's prob 0.5)
    # one image repeated: different outputs for different images of the batch
    same = crops(1).expand(8, -1, -1, -1).contiguous()
    out = augmentation(STRONG, flip=False)(batch_of(same, range(8)))["pixel_values"]
    assert len({out[i].sum().item() for i in range(8)}) >= 6  # (an image may draw no op and no box: 1/8)


def test_rand_augment_values_are_kornias_own():
    """Each op's parameter at RandAugment's level is the value kornia's RandAugment (timm's settings) puts in
    its own parameters: the same magnitudes, posterize bits, solarize thresholds, pixels of translation."""
    augment = augmentation(STRONG)
    kornia_ops = augment.ops.pixel_ops
    kornia_ops.n = len(TIMM_RAND_OPS)
    kornia_ops.rand_selector = lambda n: torch.arange(n)  # every op once, in timm's order
    shape = torch.Size([256, 3, 16, 16])
    params = kornia_ops.forward_parameters(shape)
    ops = [module[0] for module in kornia_ops.children()]
    level = torch.full((256,), kornia_ops.m / 30)
    sign = torch.where(torch.arange(256) % 2 == 0, 1.0, -1.0)
    for name, op, item in zip(TIMM_RAND_OPS, ops, params, strict=True):
        ours = _op_value(op, level, sign, shape, rand_augment=True)
        if ours is None:
            continue
        theirs = item.data[0].data[op._factor_name]
        assert torch.allclose(ours.abs().float(), theirs.abs().float(), atol=1e-5), name
        if name in ("rotate", "shear_x", "translate_y"):
            assert torch.equal(torch.sign(ours), sign)


def test_trivial_augment_values_span_kornias_draws():
    augment = augmentation(AugmentationSpec("trivialaugment"))
    shape = torch.Size([4000, 3, 16, 16])
    level = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    sign = torch.where(torch.rand(4000, generator=torch.Generator().manual_seed(1)) < 0.5, 1.0, -1.0)
    for module in augment.ops.pixel_ops.children():
        op = module[0]
        ours = _op_value(op, level, sign, shape, rand_augment=False)
        if ours is None:
            continue
        torch.manual_seed(0)
        theirs = op.forward_parameters(shape)[op._factor_name].float()
        ours = ours.float()
        spread = float(theirs.max() - theirs.min())
        for q in (0.0, 0.25, 0.5, 0.75, 1.0):
            assert abs(ours.quantile(q) - theirs.quantile(q)) <= 0.05 * spread + 1e-6, (op._factor_name, q)


def test_colour_jitter_draws_factors_per_image_within_timms_range():
    augment = augmentation(AugmentationSpec(color_jitter=0.4), flip=False)
    grey = torch.full((64, 3, 8, 8), 128, dtype=torch.uint8)
    out = augment(batch_of(grey, range(64)))["pixel_values"]
    pixels = out * torch.tensor(STD).view(-1, 1, 1) + torch.tensor(MEAN).view(-1, 1, 1)
    factors = pixels[:, 0, 0, 0] / (128 / 255)
    # brightness, contrast (identity on a flat image) and saturation (identity on grey): brightness alone shows
    assert factors.min() >= 0.6 - 1e-4 and factors.max() <= 1.4 + 1e-4
    assert len(set(factors.round(decimals=4).tolist())) > 50


def test_random_erasing_per_image_boxes_probability_and_fills():
    spec = AugmentationSpec(random_erasing_prob=0.25, random_erasing_mode="pixel")
    augment = augmentation(spec, flip=False, size=32)
    flat = torch.full((400, 3, 32, 32), 128, dtype=torch.uint8)
    out = augment(batch_of(flat, range(400)))["pixel_values"]
    reference = augmentation(None, flip=False, size=32)(batch_of(flat[:1], [0]))["pixel_values"][0]
    changed = (out != reference).any(dim=1)  # (batch, height, width)
    erased = changed.flatten(1).any(dim=1)
    assert abs(erased.float().mean() - 0.25) < 0.06
    areas = []
    for mask in changed[erased]:
        rows_, cols = torch.nonzero(mask, as_tuple=True)
        h, w = rows_.max() - rows_.min() + 1, cols.max() - cols.min() + 1
        assert h * w >= mask.sum() >= 0.95 * h * w  # one rectangle (a normal draw may equal the pixel: rarely)
        areas.append(float(h * w) / 32**2)
    assert min(areas) >= 0.02 * 0.5 and max(areas) <= 1 / 3 * 1.3
    assert len({round(a, 4) for a in areas}) > 20  # boxes differ per image
    values = out[changed.unsqueeze(1).expand_as(out)]
    assert abs(values.mean()) < 0.1 and abs(values.std() - 1) < 0.1  # "pixel": N(0, 1) noise per pixel


def test_mixup_runs_after_the_per_image_work_with_its_batch_draw():
    mixer = MixupCutmix(num_classes=5, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, seed=3)
    augment = augmentation(STRONG, mixup=mixer)
    plain = augmentation(STRONG)
    augment.set_epoch(2)
    plain.set_epoch(2)
    pixels, labels = crops(8), torch.arange(8) % 5
    batch = {**batch_of(pixels, range(8)), "labels": labels}
    mixed = augment(batch)
    assert mixer.epoch == 2  # the epoch reaches the mix
    expected = mixer({**plain(batch), "labels": labels, INDEX_COLUMN: torch.arange(8)})
    assert torch.equal(mixed["pixel_values"], expected["pixel_values"])
    assert torch.equal(mixed["labels"], expected["labels"]) and mixed["labels"].shape == (8, 5)
    assert INDEX_COLUMN not in mixed


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match="device_augmentation=True") as error:
        BatchAugmentation(build_transforms(16, MEAN, STD, train=True))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="uint8") as error:
        augmentation()(batch_of(torch.zeros(2, 3, 16, 16), [0, 1]))
    assert "\n" not in str(error.value)


def test_the_device_transform_describes_and_pickles():
    transform = build_transforms(16, MEAN, STD, train=True, seed=1, augmentation=STRONG, device_augmentation=True)
    assert "RandAugment (n=2, m=9)" in transform.describe() and "device_augmentation=True" in repr(transform)
    copy = pickle.loads(pickle.dumps(transform))
    assert torch.equal(torch.stack(copy(rows())["pixel_values"]), torch.stack(transform(rows())["pixel_values"]))
    on_workers = transform.on_workers()
    assert on_workers.augmentation == STRONG and not on_workers.crops_only
    assert torch.stack(on_workers(rows())["pixel_values"]).dtype == torch.float32
    assert "RandAugment" in augmentation(STRONG).describe()
