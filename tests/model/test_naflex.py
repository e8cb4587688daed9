"""SigLIP 2 NaFlex (`naflex.py`): a tiny random `Siglip2VisionModel` / `Siglip2ForImageClassification` saved by
transformers loads into ours and gives the same last hidden state, pooled output and logits (fp32, <= 1e-5) on one
batch of several aspect ratios made by transformers' own `Siglip2ImageProcessor` (its pixel_values, mask and
spatial_shapes fed as they are); NaFlex inputs as an option of any learned-position member; bad NaFlex batches refused
in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    Siglip2Config,
    Siglip2ForImageClassification,
    Siglip2Model,
    Siglip2VisionConfig,
    Siglip2VisionModel,
)
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel
from vit_ft.model.naflex import resize_positional_embeddings

from ..conftest import randomize
from .test_families import save_references

# a 4x4 position table (num_patches 16) of 4-pixel patches; a budget above it, so that images are resized up too
VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
          "patch_size": 4, "num_patches": 16}  # fmt: skip
TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "vocab_size": 50}  # fmt: skip
LABELS = {"id2label": {0: "ant", 1: "bee", 2: "wasp"}, "label2id": {"ant": 0, "bee": 1, "wasp": 2}}
BUDGET = 24
# (height, width) pixels: wide, tall, square and a thin strip, so grids of several shapes share one batch
IMAGE_SIZES = [(20, 60), (48, 16), (32, 32), (8, 64)]


def references() -> dict[str, torch.nn.Module]:
    return {
        "vision": Siglip2VisionModel(Siglip2VisionConfig(**VISION)),
        "vision_no_head": Siglip2VisionModel(Siglip2VisionConfig(**VISION, vision_use_head=False)),
        "image_text": Siglip2Model(Siglip2Config(vision_config=VISION, text_config=TEXT)),
        "classifier": Siglip2ForImageClassification(
            Siglip2Config(vision_config=VISION, text_config=TEXT, **LABELS)
        ),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, torch.nn.Module]]:
    return save_references(references(), tmp_path_factory)


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    """transformers' processor output for images of several aspect ratios, padded to the budget."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]
    processor = Siglip2ImageProcessorPil(patch_size=4, max_num_patches=BUDGET)
    inputs = dict(processor(images=images, return_tensors="pt"))
    assert len({tuple(s) for s in inputs["spatial_shapes"].tolist()}) == len(IMAGE_SIZES)
    assert bool((inputs["pixel_attention_mask"] == 0).any())  # some padding to mask
    return inputs


@pytest.mark.parametrize("name", list(references()))
def test_naflex_parity_with_transformers(checkpoints, batch, name):
    folder, reference = checkpoints[name]
    with torch.no_grad():
        tower = reference.vision_model if name == "image_text" else reference
        expected = tower(**batch)
        ours_cls = ViTFTForImageClassification if name == "classifier" else ViTFTModel
        model = ours_cls.from_pretrained(folder).eval()
        out = model(**batch)
    assert model.loading_report.newly_initialized == []
    assert any("patch_embedding (linear)" in what for what in model.loading_report.mapped)  # the report says so
    assert model.config.max_num_patches == 16 and model.config.grid_size == (4, 4)
    if name == "classifier":
        torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=0)
        return
    torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=0)
    if name != "vision_no_head":
        torch.testing.assert_close(out.pooler_output, expected.pooler_output, atol=1e-5, rtol=0)
    else:  # no head: our token mean over the valid patches only
        mask = batch["pixel_attention_mask"][..., None].float()
        mean = (expected.last_hidden_state * mask).sum(1) / mask.sum(1)
        torch.testing.assert_close(out.pooler_output, mean, atol=1e-5, rtol=0)


def test_each_image_alone_gives_what_it_gives_in_the_padded_batch(checkpoints, batch):
    """The mask makes padding invisible: an image's pooled output alone (no padding) equals its row in the batch."""
    model = ViTFTModel.from_pretrained(checkpoints["vision"][0]).eval()
    with torch.no_grad():
        together = model(**batch).pooler_output
        for i, (rows, cols) in enumerate(batch["spatial_shapes"].tolist()):
            n = rows * cols
            alone = model(
                pixel_values=batch["pixel_values"][i : i + 1, :n],
                pixel_attention_mask=batch["pixel_attention_mask"][i : i + 1, :n],
                spatial_shapes=batch["spatial_shapes"][i : i + 1],
            ).pooler_output
            torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=0)


def test_the_native_grid_as_images_and_as_patches_agree(checkpoints):
    """A square image at the table's own grid: the convolution path and the NaFlex path are the same model."""
    model = ViTFTModel.from_pretrained(checkpoints["vision"][0]).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    patches = pixels.reshape(2, 3, 4, 4, 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 48)  # the processor's layout
    with torch.no_grad():
        as_images = model(pixels).pooler_output
        as_patches = model(
            pixel_values=patches, pixel_attention_mask=torch.ones(2, 16, dtype=torch.long),
            spatial_shapes=torch.tensor([[4, 4], [4, 4]]),
        ).pooler_output  # fmt: skip
    torch.testing.assert_close(as_patches, as_images, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "cls+mean", "mean"])
def test_naflex_as_an_option_of_a_class_token_model(pooling):
    """A ViT with a class token and its position slot takes NaFlex batches: padding never changes a valid row."""
    config = ViTFTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         image_size=16, patch_size=4, pooling=pooling, max_num_patches=24)  # fmt: skip
    model = randomize(ViTFTModel(config))
    patches = torch.randn(1, 12, 48, generator=torch.Generator().manual_seed(1))
    short = {"pixel_attention_mask": torch.ones(1, 12), "spatial_shapes": torch.tensor([[3, 4]])}
    padded = torch.cat([patches, torch.randn(1, 12, 48)], dim=1)  # junk in the padding
    mask = torch.cat([torch.ones(1, 12), torch.zeros(1, 12)], dim=1)
    with torch.no_grad():
        alone = model(patches, **short)
        together = model(padded, pixel_attention_mask=mask, spatial_shapes=torch.tensor([[3, 4]]))
    torch.testing.assert_close(together.pooler_output, alone.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(together.last_hidden_state[:, :13], alone.last_hidden_state, atol=1e-5, rtol=0)


def test_resize_matches_bilinear_antialias_interpolate():
    """The closed form is `F.interpolate(bilinear, antialias)` on each image's grid, also for a non-square table."""
    table = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2))
    shapes = torch.tensor([[2, 7], [6, 3], [3, 5]])
    resized = resize_positional_embeddings(table, shapes, max_length=21)
    for i, (h, w) in enumerate(shapes.tolist()):
        expected = torch.nn.functional.interpolate(
            table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear", align_corners=False, antialias=True
        )[0].permute(1, 2, 0).reshape(h * w, 8)
        torch.testing.assert_close(resized[i, : h * w], expected, atol=1e-5, rtol=0)
        assert torch.equal(resized[i, h * w :], resized[i, :1].expand(21 - h * w, -1))  # padding: the first position


GOOD = {"pixel_values": torch.zeros(1, 4, 48), "pixel_attention_mask": torch.ones(1, 4),
        "spatial_shapes": torch.tensor([[2, 2]])}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pixel_values": torch.zeros(1, 4, 47)}, r"pass float patches \(batch, max_patches, 48\)"),
        ({"pixel_values": torch.zeros(1, 4, 48, dtype=torch.uint8)}, "pass float patches"),
        ({"pixel_attention_mask": None}, r"pixel_attention_mask is None: pass one \(batch, max_patches\)"),
        ({"pixel_attention_mask": torch.ones(1, 5)}, r"pixel_attention_mask is \(1, 5\)"),
        ({"spatial_shapes": torch.tensor([[2, 2, 1]])}, r"spatial_shapes \(1, 3\)"),
        ({"spatial_shapes": torch.tensor([[0, 2]])}, "positive"),
        ({"spatial_shapes": torch.tensor([[1, 3]])}, "do not match pixel_attention_mask"),
    ],
)
def test_bad_naflex_batches_are_one_line(change, message):
    config = ViTFTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                         image_size=16, patch_size=4, class_token=False, pooling="mean")  # fmt: skip
    with pytest.raises(ValueError, match=message) as error:
        ViTFTModel(config)(**{**GOOD, **change})
    assert "\n" not in str(error.value)


def test_naflex_is_refused_under_rotary_positions():
    config = ViTFTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                         image_size=16, patch_size=4, rope_theta=100.0)  # fmt: skip
    with pytest.raises(ValueError, match="rotary ones"):
        ViTFTModel(config)(**GOOD)


def test_eager_and_sdpa_agree_with_the_mask_and_the_maps_ignore_padding(checkpoints, batch):
    """The eager path (output_attentions) adds the same key mask as SDPA: equal outputs, and no attention on padding."""
    folder = checkpoints["vision"][0]
    eager = ViTFTModel.from_pretrained(folder, attn_implementation="eager").eval()
    sdpa = ViTFTModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    with torch.no_grad():
        maps = eager(**batch, output_attentions=True)
        expected = sdpa(**batch)
    torch.testing.assert_close(maps.pooler_output, expected.pooler_output, atol=1e-5, rtol=0)
    padding = batch["pixel_attention_mask"] == 0  # (B, N): keys no query may attend to
    for layer in maps.attentions:
        assert float(layer.permute(0, 3, 1, 2)[padding].abs().max()) == 0.0
