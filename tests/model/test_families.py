"""The ViT family (DeiT, DINOv2, DINOv2 with registers, CLIP, SigLIP): a tiny random-weight model of transformers'
own class, saved with save_pretrained, loads into ours and gives the same last hidden state, pooled output and
logits (fp32, <= 1e-5) at its native size and at a resampled one (`interpolate_pos_encoding=True` on its side)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    DeiTModel,
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersForImageClassification,
    Dinov2WithRegistersModel,
    SiglipConfig,
    SiglipForImageClassification,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from vit_ft import ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize

SIZE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
}
VISION = {**SIZE, "intermediate_size": 64}
TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
LABELS = {"id2label": {0: "ant", 1: "bee", 2: "wasp"}, "label2id": {"ant": 0, "bee": 1, "wasp": 2}}
DINO = {**SIZE, "mlp_ratio": 2}
NATIVE, RESAMPLED = 16, 24  # pixels: a 4x4 patch grid, and a 6x6 one


def references():
    """(name, transformers' model) for every layout we load; every parameter random (norms and scales too)."""
    return {
        "deit_teacher": DeiTForImageClassificationWithTeacher(DeiTConfig(**VISION, **LABELS)),
        "deit_model": DeiTModel(DeiTConfig(**VISION), add_pooling_layer=True),
        "dinov2_model": Dinov2Model(Dinov2Config(**DINO)),
        "dinov2_classifier": Dinov2ForImageClassification(Dinov2Config(**DINO, **LABELS)),
        # DINOv2 giant's SwiGLU MLP (mlp_ratio 4: width (int(128 * 2 / 3) + 7) // 8 * 8 = 88, not 128 * 2 / 3)
        "dinov2_swiglu": Dinov2Model(Dinov2Config(**SIZE, use_swiglu_ffn=True)),
        "dinov2_swiglu_classifier": Dinov2ForImageClassification(
            Dinov2Config(**SIZE, use_swiglu_ffn=True, **LABELS)
        ),
        "dinov2_registers": Dinov2WithRegistersModel(
            Dinov2WithRegistersConfig(**DINO, num_register_tokens=2)
        ),
        "dinov2_registers_classifier": Dinov2WithRegistersForImageClassification(
            Dinov2WithRegistersConfig(**DINO, num_register_tokens=2, **LABELS)
        ),
        "clip_vision": CLIPVisionModel(CLIPVisionConfig(**VISION)),
        "clip": CLIPModel(CLIPConfig(vision_config=VISION, text_config={**TEXT, "vocab_size": 50})),
        "siglip_vision": SiglipVisionModel(SiglipVisionConfig(**VISION)),
        "siglip": SiglipModel(SiglipConfig(vision_config=VISION, text_config={**TEXT, "vocab_size": 50})),
        "siglip_classifier": SiglipForImageClassification(
            SiglipConfig(vision_config=VISION, text_config={**TEXT, "vocab_size": 50}, **LABELS)
        ),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, torch.nn.Module]]:
    """Each reference saved by transformers into its own folder: name -> (folder, the reference in eval mode)."""
    out = {}
    for seed, (name, model) in enumerate(references().items()):
        folder = tmp_path_factory.mktemp(name)
        randomize(model, seed=seed).save_pretrained(folder)
        out[name] = (str(folder), model)
    return out


def reference_outputs(name: str, model: torch.nn.Module, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The reference's last hidden state, pooled output and logits, in the terms our model gives them."""
    with torch.no_grad():
        if name in ("clip", "siglip"):  # the image-text model: its vision tower
            model = model.vision_model
        out = model(pixels, interpolate_pos_encoding=True, output_hidden_states=True)
    if hasattr(out, "logits"):
        return {"logits": out.logits}
    result = {"last_hidden_state": out.last_hidden_state}
    if name.startswith(
        "clip"
    ):  # CLIP's last hidden state is before post_layernorm; ours is after (as timm's)
        result["last_hidden_state"] = model.post_layernorm(out.last_hidden_state)
    if not name.startswith("deit"):  # DeiT's pooler is the pre-logits dense layer we discard
        result["pooler_output"] = out.pooler_output
    return result


def our_outputs(folder: str, has_head: bool, pixels: torch.Tensor):
    cls = ViTFTForImageClassification if has_head else ViTFTModel
    model = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(pixels)
    return model, out


@pytest.mark.parametrize("size", [NATIVE, RESAMPLED])
@pytest.mark.parametrize("name", list(references()))
def test_family_parity_with_transformers(checkpoints, name, size):
    folder, reference = checkpoints[name]
    pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    expected = reference_outputs(name, reference, pixels)
    model, out = our_outputs(folder, "logits" in expected, pixels)
    assert model.loading_report.newly_initialized == []
    for key, value in expected.items():
        assert getattr(out, key).shape == value.shape, key
        torch.testing.assert_close(getattr(out, key), value, atol=1e-5, rtol=0, msg=f"{name} {key}")


def test_dinov2_swiglu_loads_as_our_swiglu_mlp(checkpoints):
    """DINOv2 giant's MLP is our mlp_type "swiglu" at transformers' width, not refused as it once was."""
    model = ViTFTModel.from_pretrained(checkpoints["dinov2_swiglu"][0])
    assert (model.config.mlp_type, model.config.intermediate_size) == ("swiglu", 88)
    assert model.layers[0].mlp.fc1.weight.shape == (2 * 88, 32)


def test_family_checkpoint_reports_what_it_discards(checkpoints):
    report = ViTFTForImageClassification.from_pretrained(
        checkpoints["siglip"][0], num_labels=2
    ).loading_report
    assert report.head == "new" and report.newly_initialized == ["classifier.weight", "classifier.bias"]
    assert any(key.startswith("text_model.*") for key in report.discarded), report.discarded
    assert {"logit_scale", "logit_bias"} <= set(report.discarded)


def test_kernelize_leaves_a_swiglu_mlp_alone(checkpoints):
    """The CPU kernels fuse exact-GELU MLPs only: a SwiGLU MLP keeps its own forward and its logits."""
    from vit_ft.kernels import kernelize
    from vit_ft.model.modeling_vit_ft import ViTFTMLP

    model = ViTFTForImageClassification.from_pretrained(checkpoints["dinov2_swiglu_classifier"][0]).eval()
    pixels = torch.randn(2, 3, NATIVE, NATIVE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(pixels).logits
        kernelize(model)
        got = model(pixels).logits
    assert type(model.vit.layers[0].mlp).forward is ViTFTMLP.forward
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
