"""vit_ft.tools.fewshot.features: frozen pre-logit features against transformers' ViT, in float32 and bf16."""

import numpy as np
import pytest
import torch
from transformers import ViTModel

from vit_ft.tools.fewshot.features import extract_features
from vit_ft.tools.trained import load_trained

from ...conftest import TINY


def test_features_are_transformers_vit_pooled_cls_and_bf16_stays_close(hf_backbone_dir, small_digits):
    with pytest.raises(ValueError, match="has no classification head"):  # what predict and evaluate need
        load_trained(hf_backbone_dir, device="cpu")
    classifier = load_trained(hf_backbone_dir, device="cpu", require_head=False)
    assert classifier.id2label == {}
    images = sorted(str(p) for p in (small_digits / "test").glob("*/*.png"))
    features, errors = extract_features(classifier, images, batch_size=5, progress=False)
    assert errors == {} and features.shape == (12, TINY["hidden_size"]) and features.dtype == np.float32
    reference = ViTModel.from_pretrained(hf_backbone_dir, add_pooling_layer=False).eval()
    pixels = torch.stack([classifier.transform.transform_image(path) for path in images])
    with torch.no_grad():
        cls = reference(pixel_values=pixels).last_hidden_state[:, 0]  # after the final LayerNorm
    np.testing.assert_allclose(features, cls.numpy(), rtol=1e-4, atol=1e-5)
    bf16, _ = extract_features(classifier, images, batch_size=5, bf16=True, progress=False)
    assert not np.array_equal(bf16, features)  # autocast ran
    np.testing.assert_allclose(bf16, features, rtol=0.05, atol=0.05 * np.abs(features).max())
