"""vit_ft.data.mixup against timm's Mixup (batch mode), written out here from timm/data/mixup.py."""

import math

import numpy as np
import pytest
import torch

from vit_ft.data.mixup import MixupCutmix, check_mixup
from vit_ft.data.transforms import INDEX_COLUMN


def timm_mix(x, target, rng, num_classes, mixup_alpha, cutmix_alpha, prob, switch_prob, smoothing):
    """timm's Mixup._mix_batch + mixup_target (mode="batch", correct_lam=True), np.random replaced by `rng`."""
    x = x.clone()
    lam, use_cutmix = 1.0, False
    if rng.random() < prob:  # _params_per_batch
        if mixup_alpha > 0.0 and cutmix_alpha > 0.0:
            use_cutmix = rng.random() < switch_prob
            lam_mix = (
                rng.beta(cutmix_alpha, cutmix_alpha) if use_cutmix else rng.beta(mixup_alpha, mixup_alpha)
            )
        elif mixup_alpha > 0.0:
            lam_mix = rng.beta(mixup_alpha, mixup_alpha)
        else:
            use_cutmix = True
            lam_mix = rng.beta(cutmix_alpha, cutmix_alpha)
        lam = float(lam_mix)
    if lam != 1.0:
        if use_cutmix:  # cutmix_bbox_and_lam -> rand_bbox
            ratio = np.sqrt(1 - lam)
            img_h, img_w = x.shape[-2:]
            cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
            cy, cx = rng.integers(0, img_h), rng.integers(0, img_w)
            yl, yh = np.clip(cy - cut_h // 2, 0, img_h), np.clip(cy + cut_h // 2, 0, img_h)
            xl, xh = np.clip(cx - cut_w // 2, 0, img_w), np.clip(cx + cut_w // 2, 0, img_w)
            lam = 1.0 - (yh - yl) * (xh - xl) / float(img_h * img_w)
            x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
        else:
            x_flipped = x.flip(0).mul_(1.0 - lam)
            x.mul_(lam).add_(x_flipped)
    off_value = smoothing / num_classes  # mixup_target
    on_value = 1.0 - smoothing + off_value
    y1 = torch.full((len(target), num_classes), off_value).scatter_(1, target.view(-1, 1), on_value)
    y2 = torch.full((len(target), num_classes), off_value).scatter_(1, target.flip(0).view(-1, 1), on_value)
    return x, y1 * lam + y2 * (1.0 - lam)


def batch(size=6, height=12, width=10, classes=5, start=0):
    generator = torch.Generator().manual_seed(start)
    return {
        "pixel_values": torch.randn(size, 3, height, width, generator=generator),
        "labels": torch.arange(size) % classes,
        INDEX_COLUMN: torch.arange(start, start + size),
    }


@pytest.mark.parametrize(
    ("mixup_alpha", "cutmix_alpha", "prob", "smoothing"),
    [(0.8, 0.0, 1.0, 0.0), (0.0, 1.0, 1.0, 0.1), (0.8, 1.0, 1.0, 0.1), (0.2, 1.0, 0.5, 0.0)],
)
def test_mix_equals_timms_formulas(mixup_alpha, cutmix_alpha, prob, smoothing):
    mixer = MixupCutmix(5, mixup_alpha, cutmix_alpha, prob, 0.5, smoothing, seed=3)
    kinds = set()
    for start in range(30):
        b = batch(start=start)
        rng = mixer.generator(b[INDEX_COLUMN], b["labels"])
        x, y = timm_mix(
            b["pixel_values"], b["labels"], rng, 5, mixup_alpha, cutmix_alpha, prob, 0.5, smoothing
        )
        out = mixer(b)
        assert (
            INDEX_COLUMN not in out and out["labels"].shape == (6, 5) and out["labels"].dtype == torch.float32
        )
        assert torch.allclose(out["pixel_values"], x, atol=1e-6)
        assert torch.allclose(out["labels"], y, atol=1e-6)
        assert torch.allclose(out["labels"].sum(1), torch.ones(6))
        lam = float(out["labels"][0, 0] - y[0].min()) if smoothing == 0 else None
        kinds.add("none" if torch.equal(out["pixel_values"], b["pixel_values"]) else "mixed")
        assert lam is None or 0 <= lam <= 1
    assert kinds == ({"none", "mixed"} if prob < 1 else {"mixed"})


def test_cutmix_lam_is_the_uncovered_fraction_and_pixels_come_from_the_reversed_batch():
    mixer = MixupCutmix(4, cutmix_alpha=1.0, seed=0)
    for start in range(20):
        size, height, width = 4, 13, 9  # odd sides: the box is clipped and rounded
        pixels = torch.arange(size, dtype=torch.float32).view(size, 1, 1, 1).expand(size, 3, height, width)
        out = mixer(
            {
                "pixel_values": pixels,
                "labels": torch.arange(size),
                INDEX_COLUMN: torch.arange(start, start + 4),
            }
        )
        for i in range(size):
            own = out["pixel_values"][i, 0] == i
            other = out["pixel_values"][i, 0] == size - 1 - i
            assert bool((own | other).all())
            # the pasted pixels form one rectangle
            rows, cols = torch.nonzero(other, as_tuple=True)
            if len(rows):
                box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
                assert box == len(rows)
            lam = out["labels"][i, i].item()
            assert math.isclose(lam, own.float().mean().item(), abs_tol=1e-6)
            assert math.isclose(out["labels"][i, size - 1 - i].item(), 1 - lam, abs_tol=1e-6)


def test_mixup_blends_with_the_reversed_batch():
    mixer = MixupCutmix(4, mixup_alpha=0.4, seed=1)
    b = batch(size=4, classes=4)
    out = mixer(b)
    lam = out["labels"][0, b["labels"][0]].item()
    expected = b["pixel_values"] * lam + b["pixel_values"].flip(0) * (1 - lam)
    assert 0 < lam < 1 and torch.allclose(out["pixel_values"], expected, atol=1e-6)


def test_draws_are_a_function_of_seed_epoch_and_indices():
    mixer = MixupCutmix(5, 0.8, 1.0, seed=7)
    first = [mixer(batch(start=s)) for s in range(5)]
    again = [mixer(batch(start=s)) for s in range(5)]
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(first, again, strict=True))
    mixer.set_epoch(1)
    other_epoch = [mixer(batch(start=s)) for s in range(5)]
    assert not all(torch.equal(a["labels"], b["labels"]) for a, b in zip(first, other_epoch, strict=True))
    other_seed = [MixupCutmix(5, 0.8, 1.0, seed=8)(batch(start=s)) for s in range(5)]
    assert not all(torch.equal(a["labels"], b["labels"]) for a, b in zip(first, other_seed, strict=True))
    state = torch.get_rng_state()
    mixer(batch())
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched


def test_collate_mixes_train_examples_and_leaves_eval_examples_alone():
    mixer = MixupCutmix(3, mixup_alpha=1.0, seed=0)
    train = [
        {"pixel_values": torch.full((3, 4, 4), float(i)), "labels": i, INDEX_COLUMN: 10 + i} for i in range(3)
    ]
    mixed = mixer.collate(train)
    assert set(mixed) == {"pixel_values", "labels"} and mixed["labels"].shape == (3, 3)
    expected = mixer({"pixel_values": torch.stack([e["pixel_values"] for e in train]), "labels": torch.arange(3),
                      INDEX_COLUMN: torch.tensor([10, 11, 12])})  # fmt: skip
    assert torch.equal(mixed["labels"], expected["labels"])
    evaluation = [{"pixel_values": torch.zeros(3, 4, 4), "labels": i} for i in range(3)]
    plain = mixer.collate(evaluation)
    assert plain["labels"].dtype == torch.long and plain["labels"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"mixup_alpha": -0.1}, "mixup_alpha"), ({"cutmix_alpha": float("nan")}, "cutmix_alpha"),
     ({"mixup_alpha": 0.0}, "both 0"), ({"prob": 1.5}, "mixup_prob"), ({"switch_prob": -1}, "mixup_switch_prob"),
     ({"label_smoothing": 1.0}, "label_smoothing"), ({"num_classes": 0}, "num_classes")],
)  # fmt: skip
def test_bad_settings_are_one_line_errors(kwargs, name):
    settings = {"num_classes": 3, "mixup_alpha": 0.8, "cutmix_alpha": 0.0} | kwargs
    with pytest.raises(ValueError, match=name) as error:
        check_mixup(settings.pop("num_classes"), settings.pop("mixup_alpha"), settings.pop("cutmix_alpha"),
                    settings.get("prob", 1.0), settings.get("switch_prob", 0.5), settings.get("label_smoothing", 0.0))  # fmt: skip
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=name):
        MixupCutmix(**{"num_classes": 3, "mixup_alpha": 0.8} | kwargs)


def test_epoch_set_in_the_main_process_reaches_persistent_workers():
    """The collator runs in the DataLoader workers: the epoch set before each epoch must reach them."""
    examples = [
        {"pixel_values": torch.full((3, 4, 4), float(i)), "labels": i % 2, INDEX_COLUMN: i} for i in range(4)
    ]
    mixer = MixupCutmix(2, mixup_alpha=1.0, seed=0)
    loader = torch.utils.data.DataLoader(
        examples, batch_size=4, num_workers=1, persistent_workers=True, collate_fn=mixer.collate
    )
    for epoch in (0, 1, 2):
        mixer.set_epoch(epoch)
        (in_worker,) = list(loader)
        assert torch.equal(in_worker["labels"], mixer.collate(examples)["labels"]), epoch
