"""vit_ft.data.augmentation: timm's RandAugment levels and draws, random erasing's geometry and fills, colour
jitter's range, reproducible draws, and the train transform that applies them."""

import math
import pickle

import numpy as np
import pytest
import torch

from vit_ft.data.augmentation import (
    RAND_AUGMENT_OP_PROBABILITY,
    TIMM_RAND_OPS,
    AugmentationSpec,
    TimmRandAugment,
    TimmRandomErasing,
)
from vit_ft.data.transforms import INDEX_COLUMN, augmentation_seed, build_transforms

from ..sample_images import encoded, photo

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run): kornia's floor

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
ZERO, ONE = torch.zeros(3, 1, 1), torch.ones(3, 1, 1)


def timm_level(name: str, magnitude: float, width: int) -> float | None:
    """timm's auto_augment._LEVEL_TO_ARG for _RAND_TRANSFORMS, on [0, 1] pixels (None: no magnitude)."""
    level = magnitude / 10  # _LEVEL_DENOM
    return {
        "rotate": 30.0 * level,
        "posterize": int(level * 4),
        "solarize": (256 - int(level * 256)) / 255,  # the first inverted value, as a fraction of 255
        "solarize_add": int(level * 110) / 255,
        "color": level * 1.8 + 0.1, "contrast": level * 1.8 + 0.1,
        "brightness": level * 1.8 + 0.1, "sharpness": level * 1.8 + 0.1,
        "shear_x": level * 0.3, "shear_y": level * 0.3,
        "translate_x": level * 0.45 * width, "translate_y": level * 0.45 * width,
    }.get(name)  # fmt: skip


PARAMETER = {"rotate": "degrees", "posterize": "bits_factor", "solarize": "thresholds", "solarize_add": "additions",
             "color": "saturation_factor", "contrast": "contrast_factor", "brightness": "brightness_factor",
             "sharpness": "sharpness", "shear_x": "shear_x", "shear_y": "shear_y", "translate_x": "translate_x",
             "translate_y": "translate_y"}  # fmt: skip


@pytest.mark.parametrize("magnitude", [0, 5, 9, 10])
def test_rand_augment_levels_equal_timms(magnitude):
    augment = TimmRandAugment(num_ops=2, magnitude=magnitude)
    augment.n = len(TIMM_RAND_OPS)
    augment.rand_selector = lambda n: torch.arange(n)  # every op once, in timm's order
    params = augment.forward_parameters(torch.Size([64, 3, 32, 32]))
    for name, item in zip(TIMM_RAND_OPS, params, strict=True):
        values = item.data[0].data
        assert abs(values["batch_prob"].mean().item() - RAND_AUGMENT_OP_PROBABILITY) < 0.25, name
        expected = timm_level(name, magnitude, 32)
        if expected is None:
            continue
        got = values[PARAMETER[name]].abs().float()
        if name.startswith("shear"):  # kornia shears by an angle in degrees: tan gives timm's matrix entry
            got = torch.tan(torch.deg2rad(got))
        if name == "solarize_add":
            assert torch.all(values["thresholds"] == 0.5)  # timm's fixed threshold 128
        tolerance = 0.02 if name.startswith("solarize") else 1e-4  # solarize: timm's 256 steps
        assert torch.allclose(got, torch.tensor(float(expected)), atol=tolerance), (name, got[0], expected)
        if name in ("rotate", "shear_x", "translate_y") and magnitude > 0:  # timm's random sign
            assert {1.0, -1.0} <= set(torch.sign(values[PARAMETER[name]]).tolist())


# torchvision's TrivialAugmentWide (31 bins) on a 224-px image: the largest magnitude of each symmetric op,
# in the units of kornia's parameter (a shear's after tan: the shear factor)
WIDE_MAXIMA = {"degrees": 135.0, "shear_x": 0.99, "shear_y": 0.99, "translate_x": 32.0, "translate_y": 32.0}


def test_trivial_augment_draws_torchvisions_wide_ranges():
    """Under whichever kornia is installed: the symmetric ops uniform in [0, max] with a random sign
    (shears in shear factors, not angles), posterize's bits 2..8 with the two ends the rarest (torchvision:
    3 bins each of 31 against 5; kornia's rounded draw: half as likely as the others)."""
    shape = torch.Size([4000, 3, 224, 224])
    torch.manual_seed(0)
    for module in AugmentationSpec("trivialaugment").build().pixel_ops.children():
        name = module[0]._factor_name
        if name not in (*WIDE_MAXIMA, "bits_factor"):
            continue
        values = module[0].forward_parameters(shape)[name].float()
        if name == "bits_factor":
            assert values.min() == 2 and values.max() == 8
            share = torch.bincount(values.long(), minlength=9)[2:] / len(values)
            ends, middle = share[[0, -1]], share[1:-1]  # a uniform draw of 2..8: 1/7 each
            assert ends.min() > 0.06 and ends.max() < 0.115, share
            assert middle.min() > 0.145 and middle.max() < 0.19, share
            continue
        if name.startswith("shear"):
            values = torch.tan(torch.deg2rad(values))
        fraction = values.abs() / WIDE_MAXIMA[name]
        assert 0.99 < fraction.max() <= 1 + 1e-4, name
        # uniform (a shear uniform in angle instead: 0.44)
        assert abs(fraction.mean() - 0.5) < 0.02, (name, fraction.mean())
        assert 0.45 < (values > 0).float().mean() < 0.55, name


def test_rand_augment_draws_ops_with_replacement():
    augment = TimmRandAugment(num_ops=3, magnitude=9)
    torch.manual_seed(0)
    draws = [augment.rand_selector(3).tolist() for _ in range(200)]
    assert any(len(set(d)) < 3 for d in draws)  # repeats happen (timm: np.random.choice(replace=True))
    assert set(sum(draws, [])) == set(range(len(TIMM_RAND_OPS)))


def erased(mode: str, seeds: range, p: float = 1.0, size=(40, 60)):
    erasing = TimmRandomErasing(p, mode)
    outs = []
    for seed in seeds:
        torch.manual_seed(seed)
        outs.append(erasing(torch.full((1, 3, *size), 7.0))[0])
    return outs


def test_random_erasing_box_geometry_and_probability():
    height, width = 40, 60
    areas, ratios = [], []
    for out in erased("const", range(300)):
        mask = out[0] != 7.0
        rows, cols = torch.nonzero(mask, as_tuple=True)
        h, w = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
        assert h * w == mask.sum()  # one rectangle
        assert torch.all(out[:, mask] == 0)  # const: zeros, the mean colour after normalisation
        areas.append(float(h * w) / (height * width))
        ratios.append(float(h / w))
    assert min(areas) >= 0.02 * 0.8 and max(areas) <= 1 / 3 * 1.2  # rounding to whole pixels
    assert abs(np.mean(areas) - (0.02 + 1 / 3) / 2) < 0.03  # uniform in the area range
    assert min(ratios) >= 0.3 * 0.8 and max(ratios) <= 1 / 0.3 * 1.2
    assert 0.35 < np.mean(np.array(ratios) > 1) < 0.65  # as often tall as wide
    changed = [bool((out != 7.0).any()) for out in erased("const", range(400), p=0.25)]
    assert abs(np.mean(changed) - 0.25) < 0.06


def test_random_erasing_fills_like_timms_modes():
    pixel_values, colours = [], []
    for out in erased("pixel", range(20)):
        mask = out[0] != 7.0
        pixel_values.append(out[:, mask].flatten())
    values = torch.cat(pixel_values)
    assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.05  # standard normal per pixel
    for out in erased("rand", range(200)):
        mask = out[0] != 7.0
        box = out[:, mask]
        assert torch.all(box == box[:, :1])  # one colour per channel
        colours.append(box[:, 0])
    colours = torch.stack(colours)
    assert abs(colours.mean()) < 0.15 and abs(colours.std() - 1) < 0.15
    assert not torch.equal(colours[:, 0], colours[:, 1])  # channels drawn apart


def test_color_jitter_scales_brightness_within_timms_range_and_yields_to_auto_augment():
    augment = AugmentationSpec(color_jitter=0.4).build()
    grey = torch.full((3, 8, 8), 0.5)
    factors = [augment(grey, ZERO, ONE, seed=s)[0, 0, 0].item() / 0.5 for s in range(200)]
    assert 0.6 - 1e-5 <= min(factors) < 0.7 and 1.3 < max(factors) <= 1.4 + 1e-5
    with_auto = AugmentationSpec("randaugment", color_jitter=0.4).build()
    assert isinstance(with_auto.pixel_ops, TimmRandAugment)  # timm drops the jitter under an auto-augment


@pytest.mark.parametrize("auto_augment", ["randaugment", "trivialaugment"])
def test_draws_are_a_function_of_the_seed_and_leave_the_global_rng(auto_augment):
    augment = AugmentationSpec(auto_augment, random_erasing_prob=0.5, random_erasing_mode="rand").build()
    image = torch.rand(3, 24, 24, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    first = [augment(image, ZERO, ONE, seed=s) for s in range(12)]
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(a, augment(image, ZERO, ONE, seed=s)) for s, a in enumerate(first))
    assert len({a.sum().item() for a in first}) > 6  # different seeds, different draws
    assert all(a.shape == image.shape for a in first)


@pytest.mark.parametrize(
    ("field", "value"),
    [("auto_augment", "autoaugment"), ("rand_augment_num_ops", 0), ("rand_augment_num_ops", 2.5),
     ("rand_augment_magnitude", 11), ("rand_augment_magnitude", -1), ("color_jitter", -0.1),
     ("random_erasing_prob", 1.5), ("random_erasing_mode", "noise")],
)  # fmt: skip
def test_bad_spec_is_a_one_line_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field) as error:
        AugmentationSpec(**{field: value})
    assert "\n" not in str(error.value)


def rows(count=3):
    images = [{"bytes": encoded(photo(48, 36, seed=i)), "path": f"{i}.png"} for i in range(count)]
    return {"image": images, "label": [0] * count, INDEX_COLUMN: list(range(count))}


def test_train_transform_applies_the_spec_from_the_per_sample_generator():
    spec = AugmentationSpec("randaugment", random_erasing_prob=0.5, random_erasing_mode="pixel")
    transform = build_transforms(16, MEAN, STD, train=True, seed=3, augmentation=spec)
    transform.set_epoch(2)
    out = transform(rows())
    assert out[INDEX_COLUMN] == [0, 1, 2]  # passed on for the batch-level mix
    for index in range(3):
        generator = torch.Generator().manual_seed(augmentation_seed(3, 2, index))
        assert torch.equal(
            transform.transform_image(rows()["image"][index], generator), out["pixel_values"][index]
        )
    plain = build_transforms(16, MEAN, STD, train=True, seed=3)
    plain.set_epoch(2)
    assert not any(
        torch.equal(a, b) for a, b in zip(out["pixel_values"], plain(rows())["pixel_values"], strict=True)
    )
    transform.set_epoch(3)
    assert not torch.equal(torch.stack(out["pixel_values"]), torch.stack(transform(rows())["pixel_values"]))
    assert "RandAugment (n=2, m=9)" in repr(transform) and "RandAugment" in transform.describe()


def test_inactive_spec_and_eval_leave_the_transform_as_before():
    for train in (True, False):
        before = build_transforms(16, MEAN, STD, train=train, seed=1)
        for spec in (None, AugmentationSpec()):
            after = build_transforms(16, MEAN, STD, train=train, seed=1, augmentation=spec)
            assert torch.equal(
                torch.stack(before(rows())["pixel_values"]), torch.stack(after(rows())["pixel_values"])
            )
    spec = AugmentationSpec("trivialaugment", random_erasing_prob=1.0)
    evaluation = build_transforms(16, MEAN, STD, train=False, augmentation=spec)
    plain = build_transforms(16, MEAN, STD, train=False)
    assert torch.equal(
        torch.stack(evaluation(rows())["pixel_values"]), torch.stack(plain(rows())["pixel_values"])
    )
    assert INDEX_COLUMN not in evaluation(rows())
    assert math.isfinite(float(torch.stack(evaluation(rows())["pixel_values"]).sum()))


@pytest.mark.parametrize("spec", [AugmentationSpec("randaugment", random_erasing_prob=0.5), AugmentationSpec("trivialaugment"), AugmentationSpec(color_jitter=0.4)])  # fmt: skip
def test_augmented_transform_pickles_for_spawned_workers(spec):
    transform = build_transforms(16, MEAN, STD, train=True, seed=1, augmentation=spec)
    copy = pickle.loads(pickle.dumps(transform))
    assert torch.equal(
        torch.stack(copy(rows())["pixel_values"]), torch.stack(transform(rows())["pixel_values"])
    )
