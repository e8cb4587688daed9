"""Export of the ViT family to the family's own transformers class: a model loaded from a checkpoint of transformers'
class (saved by it, random weights) is exported, loaded back by `AutoModelForImageClassification` without remote
code, and gives our logits (<= 1e-5); `pipeline("image-classification")` runs on the folder. SigLIP 2 NaFlex is
Siglip2ForImageClassification with its NaFlex processor (logits on a batch of several aspect ratios). A model no class
expresses exactly (SigLIP's and SigLIP 2's attention pooling, NaFlex with a class token, CLIP and MetaCLIP 2, DINOv2
without its cls+mean head, DINOv3's rotary ViT, AIMv2, MAE's fc_norm layout) is refused in one line; MAE and MSN with
the class token's head are transformers' ViT."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

from vit_ft import ViTFTForImageClassification
from vit_ft.model.export import export_to_transformers, transformers_class_for, transformers_export_reason

from ..conftest import randomize, tiny_ft_config
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
NEW_LABELS = {"mae": {"num_labels": 3}}
NAFLEX_IMAGE_SIZES = [(20, 60), (48, 16), (32, 32), (8, 64)]  # (height, width), SigLIP 2's NaFlex tests  # a checkpoint without a head, given one
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


def naflex_images() -> list[Image.Image]:
    """Wide, tall, square and a strip: their grids resize the 4x4 position table down one way, up the other."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in NAFLEX_IMAGE_SIZES]


def test_siglip2_naflex_exports_to_siglip2_with_its_processor(tmp_path):
    """A SigLIP 2 NaFlex classifier (mean pooling over the unmasked patches) is transformers' Siglip2 classifier:
    the same logits on a NaFlex batch of several aspect ratios, its own processor beside it, and `pipeline()` runs."""
    from transformers import Siglip2Config, Siglip2ForImageClassification
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    from .test_naflex import LABELS, TEXT, VISION

    config = Siglip2Config(vision_config=VISION, text_config=TEXT, **LABELS)
    randomize(Siglip2ForImageClassification(config), seed=2).save_pretrained(tmp_path / "siglip2")
    model = fine_tuned(str(tmp_path / "siglip2"))
    assert transformers_class_for(model.config) == "Siglip2ForImageClassification"
    folder = export_to_transformers(model, tmp_path / "hf")

    exported = AutoModelForImageClassification.from_pretrained(folder).eval()  # no remote code
    assert type(exported).__name__ == "Siglip2ForImageClassification"
    processor = AutoImageProcessor.from_pretrained(folder)
    assert type(processor).__name__.startswith("Siglip2ImageProcessor")
    assert (processor.patch_size, processor.max_num_patches) == (4, model.config.max_num_patches)
    batch = dict(Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16)(naflex_images(), return_tensors="pt"))
    assert len({tuple(s) for s in batch["spatial_shapes"].tolist()}) == len(NAFLEX_IMAGE_SIZES)
    with torch.no_grad():
        expected, got = model(**batch).logits, exported(**batch).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    predictions = pipeline("image-classification", model=str(folder), device="cpu")(naflex_images()[0], top_k=3)
    assert {p["label"] for p in predictions} == set(model.config.id2label.values())


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({}, "Siglip2ForImageClassification cannot express pooling='map' (it needs 'mean')"),  # SigLIP 2's map head
        ({"pooling": "cls", "class_token": True}, "cannot express pooling='cls' (it needs 'mean'); class_token=True"),
    ],
)
def test_a_naflex_model_siglip2_cannot_express_is_refused(tmp_path, overrides, named):
    """SigLIP 2's attention-pooling head, and NaFlex on a member with a class token: no transformers class takes
    them (Siglip2ForImageClassification averages the patches), so they are shared with vit_ft's code."""
    from .test_naflex import LABELS, references

    randomize(references()["vision"], seed=4).save_pretrained(tmp_path / "vision")
    model = fine_tuned(str(tmp_path / "vision"), **LABELS, **overrides)
    assert model.config.max_num_patches is not None
    assert transformers_class_for(model.config) is None and named in transformers_export_reason(model.config)
    with pytest.raises(ValueError, match="share it in the vit_ft format") as error:
        export_to_transformers(model, tmp_path / "hf")
    assert named in str(error.value) and "\n" not in str(error.value)
