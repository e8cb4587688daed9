"""NaFlex in the data path (`vit_ft/data/naflex.py` and the transforms' `max_num_patches`): the size rule and the
patch layout of transformers' `Siglip2ImageProcessor`, its batch reproduced by our eval transform + collator, the
train transform's crops within the budget, and a collated batch run by the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.siglip2.image_processing_pil_siglip2 import (
    Siglip2ImageProcessorPil,
    convert_image_to_patches,
    get_image_size_for_max_num_patches,
)

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.data.collate import collate_fn
from vit_ft.data.naflex import collate_patches, from_patches, image_size_for_max_num_patches, to_patches
from vit_ft.data.transforms import build_transforms

HALF = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}


@pytest.mark.parametrize("size", [(20, 60), (48, 16), (32, 32), (8, 64), (3, 500), (1000, 7), (224, 224)])
@pytest.mark.parametrize("budget", [1, 12, 24, 256])
def test_size_rule_is_the_processors(size, budget):
    assert image_size_for_max_num_patches(*size, 4, budget) == get_image_size_for_max_num_patches(*size, 4, budget)


def test_patch_layout_is_the_processors():
    pixels = torch.randn(3, 12, 20)
    ours = to_patches(pixels, 4)
    assert ours.shape == (3, 5, 48)
    assert torch.equal(ours.flatten(0, 1), torch.from_numpy(convert_image_to_patches(pixels.numpy(), 4)))
    assert torch.equal(from_patches(ours, 4), pixels)  # the figures' way back


def images_at_their_naflex_size() -> list[Image.Image]:
    """Images already at their size under the budget of 12 (no resampling on either side): 8x24, 12x16, 4x48."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(8, 24), (12, 16), (4, 48)]]


def test_eval_transform_and_collator_give_the_processors_batch():
    images = images_at_their_naflex_size()
    processor = Siglip2ImageProcessorPil(patch_size=4, max_num_patches=12)
    expected = processor(images=images, return_tensors="pt")
    transform = build_transforms(16, train=False, max_num_patches=12, patch_size=4, **HALF)
    examples = transform({"image": images, "label": [0, 1, 2]})
    rows = [dict(zip(examples, values, strict=True)) for values in zip(*examples.values(), strict=True)]
    batch = collate_fn(rows)
    assert batch["spatial_shapes"].tolist() == expected["spatial_shapes"].tolist() == [[2, 6], [3, 4], [1, 12]]
    torch.testing.assert_close(batch["pixel_values"], expected["pixel_values"], atol=1e-6, rtol=0)
    assert torch.equal(batch["pixel_attention_mask"], expected["pixel_attention_mask"].int())
    assert batch["labels"].tolist() == [0, 1, 2]
    # the tools' collation of the same images (no labels, the batch's own length)
    tools = transform.collate([transform.transform_image(image) for image in images])
    torch.testing.assert_close(tools["pixel_values"], expected["pixel_values"], atol=1e-6, rtol=0)


def test_a_wide_image_keeps_its_aspect_ratio():
    wide = Image.new("RGB", (300, 100))
    grid = build_transforms(16, train=False, max_num_patches=48, patch_size=4, **HALF).transform_image(wide)
    assert grid.shape[:2] == (4, 12)  # 3:1 at 48 patches, where a square crop would keep the middle third


def test_train_crops_stay_within_the_budget_and_are_seeded():
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 120, 3), dtype=np.uint8))
    transform = build_transforms(16, train=True, max_num_patches=24, patch_size=4, seed=3, **HALF)
    grids = [transform.transform_image(image, transform.sample_generator(i)) for i in range(8)]
    assert all(g.shape[0] * g.shape[1] <= 24 and g.shape[-1] == 48 for g in grids)
    again = transform.transform_image(image, transform.sample_generator(5))
    assert torch.equal(again, grids[5])
    assert len({tuple(g.shape[:2]) for g in grids}) > 1 or len({g.sum().item() for g in grids}) > 1


def test_naflex_is_refused_with_device_augmentation():
    with pytest.raises(ValueError, match="device_augmentation=False"):
        build_transforms(16, train=True, max_num_patches=24, patch_size=4, device_augmentation=True, **HALF)


def test_a_collated_batch_runs_through_the_model_as_each_image_alone():
    config = ViTFTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                         image_size=16, patch_size=4, class_token=False, no_embed_class=True, pooling="map",
                         max_num_patches=12, num_labels=3)  # fmt: skip
    model = ViTFTForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight)
    transform = build_transforms(16, train=False, max_num_patches=12, patch_size=4, **HALF)
    grids = [transform.transform_image(image) for image in images_at_their_naflex_size()]
    with torch.no_grad():
        together = model(**transform.collate(grids)).logits
        alone = torch.cat([model(**collate_patches([g], [g.shape[:2]])).logits for g in grids])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
