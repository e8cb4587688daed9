"""Tests for vit_ft.training.pretrain: one short epoch writes a transformers ViTModel checkpoint with ViT's processor."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTImageProcessorPil, ViTModel

from vit_ft.data.images import VIT_MEAN, VIT_STD
from vit_ft.training.pretrain import DIGITS_VIT, pretrain_digits, read_image_folder

SIZE = 16  # the pre-training resolution; images already at it are not resampled


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    rng = np.random.default_rng(0)
    for name in ("0", "1", "2"):
        (root / name).mkdir()
        for i in range(4):
            pixels = rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def pretrained(image_folder, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("pretrained") / "vit"
    return pretrain_digits(output_dir, image_folder, epochs=1, batch_size=8)


def test_writes_a_vit_model_that_transformers_loads(pretrained):
    # the encoder only: no pooler (a fine-tune classifies the CLS token or the mean token, not the pooler's output)
    model, info = ViTModel.from_pretrained(pretrained, add_pooling_layer=False, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    config = model.config
    assert config.model_type == "vit" and config.image_size == SIZE and config.patch_size == 4
    assert {name: getattr(config, name) for name in DIGITS_VIT} == DIGITS_VIT
    with torch.no_grad():
        hidden = model(torch.randn(2, 3, SIZE, SIZE)).last_hidden_state
    assert hidden.shape == (2, 1 + (SIZE // 4) ** 2, DIGITS_VIT["hidden_size"])


def test_processor_normalises_as_the_pretraining_did(pretrained, image_folder):
    processor = ViTImageProcessorPil.from_pretrained(pretrained)
    assert list(processor.image_mean) == list(VIT_MEAN) and list(processor.image_std) == list(VIT_STD)
    assert processor.size == {"height": SIZE, "width": SIZE}
    pixels, labels, classes = read_image_folder(image_folder, SIZE)
    assert classes == ["0", "1", "2"] and labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    with Image.open(image_folder / "1" / "2.png") as image:
        expected = processor(image, return_tensors="pt")["pixel_values"][0]
    assert torch.allclose(pixels[6], expected, atol=1e-6)
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0 and pixels.min() < -0.9 and pixels.max() > 0.9
