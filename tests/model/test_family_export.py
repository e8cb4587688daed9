"""Export of the ViT family to the family's own transformers class: a model loaded from a checkpoint of transformers'
class (saved by it, random weights) is exported, loaded back by `AutoModelForImageClassification` without remote
code, and gives our logits (<= 1e-5); `pipeline("image-classification")` runs on the folder. A model no class
expresses exactly (SigLIP's attention pooling, CLIP and MetaCLIP 2, DINOv2 without its cls+mean head, DINOv3's
rotary ViT, AIMv2, MAE's fc_norm layout) is refused in one line; MAE and MSN with the class token's head are transformers'
ViT."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageClassification, pipeline

from vit_ft import ViTFTForImageClassification
from vit_ft.model.export import export_to_transformers, transformers_class_for, transformers_export_reason

from ..conftest import tiny_ft_config
from .test_families import NATIVE

# checkpoint (test_families.references) -> the class its fine-tune is exported to
EXPORTS = {
    "deit_teacher": "DeiTForImageClassificationWithTeacher",
    "dinov2_classifier": "Dinov2ForImageClassification",
    "dinov2_swiglu_classifier": "Dinov2ForImageClassification",  # use_swiglu_ffn=True
    "dinov2_registers_classifier": "Dinov2WithRegistersForImageClassification",
    "siglip_classifier": "SiglipForImageClassification",
    "msn_classifier": "ViTForImageClassification",  # ViTMSNForImageClassification computes the same
    "mae": "ViTForImageClassification",  # fine-tuned on the class token (new labels)
}
NEW_LABELS = {"mae": {"num_labels": 3}}  # a checkpoint without a head, given one
# checkpoint, new labels and pooling -> what the refusal names
REFUSED = {
    "siglip": ({"pooling": "map"}, "pooling='map' (it needs 'mean')"),
    "clip_vision": ({"pooling": "mean"}, "CLIPForImageClassification (and MetaCLIP 2's) averages the patch"),
    "dinov2_model": ({"pooling": "cls"}, "Dinov2ForImageClassification cannot express pooling='cls'"),
    "metaclip2_vision": ({"pooling": "mean"}, "(and MetaCLIP 2's) averages the patch tokens before"),
    "dinov3": ({}, "no image-classification class for DINOv3's rotary ViT"),
    "aimv2_vision": ({}, "no image-classification class for AIMv2's RMSNorm ViT"),
    "mae": ({"pooling": "mean", "fc_norm": True}, "fc_norm=True (it needs False)"),
}


def fine_tuned(folder: str, **kwargs) -> ViTFTForImageClassification:
    """Ours from the checkpoint, with a head of random weights as after fine-tuning."""
    model = ViTFTForImageClassification.from_pretrained(folder, **kwargs).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "classifier" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


@pytest.mark.parametrize("name", list(EXPORTS))
def test_family_exports_to_its_own_transformers_class(checkpoints, tmp_path, name):
    model = fine_tuned(checkpoints[name][0], **NEW_LABELS.get(name, {}))
    assert (
        transformers_class_for(model.config) == EXPORTS[name]
        and transformers_export_reason(model.config) == ""
    )
    folder = export_to_transformers(model, tmp_path / "hf")

    exported = AutoModelForImageClassification.from_pretrained(folder).eval()  # no remote code
    assert type(exported).__name__ == EXPORTS[name] and type(exported).__module__.startswith("transformers.")
    assert exported.config.id2label == model.config.id2label
    pixels = torch.randn(2, 3, NATIVE, NATIVE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = model(pixels).logits, exported(pixels).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 28, 3), dtype=np.uint8))
    predictions = pipeline("image-classification", model=str(folder), device="cpu")(image, top_k=3)
    assert {p["label"] for p in predictions} == set(model.config.id2label.values())
    assert sum(p["score"] for p in predictions) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_model_no_transformers_class_expresses_is_refused(checkpoints, tmp_path, name):
    overrides, named = REFUSED[name]
    model = fine_tuned(checkpoints[name][0], num_labels=3, **overrides)
    assert transformers_class_for(model.config) is None and named in transformers_export_reason(model.config)
    with pytest.raises(ValueError, match="share it in the vit_ft format") as error:
        export_to_transformers(model, tmp_path / "hf")
    assert named in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "hf").exists()


def test_plain_vit_is_transformers_vit():
    assert transformers_class_for(tiny_ft_config(num_labels=2)) == "ViTForImageClassification"
    assert "pooling='mean'" in transformers_export_reason(tiny_ft_config(num_labels=2, pooling="mean"))
    assert "num_labels=0" in transformers_export_reason(tiny_ft_config(num_labels=0))


def test_swiglu_maps_to_dinov2_only_at_a_width_it_can_state():
    swiglu = {"layerscale_value": 1.0, "pooling": "cls+mean", "mlp_type": "swiglu", "num_labels": 2}
    assert (
        transformers_class_for(tiny_ft_config(**swiglu, intermediate_size=88))
        == "Dinov2ForImageClassification"
    )
    assert "SwiGLU width" in transformers_export_reason(tiny_ft_config(**swiglu, intermediate_size=60))
    reason = transformers_export_reason(
        tiny_ft_config(mlp_type="swiglu", num_labels=2)
    )  # no layer scale: ViT
    assert "mlp_type='swiglu' (it needs 'gelu')" in reason
