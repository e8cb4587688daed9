"""The ViT family (DeiT, DINOv2, DINOv2 with registers, DINOv3, CLIP, MetaCLIP 2, SigLIP, MAE, MSN, AIMv2): a tiny
random-weight model of transformers' own class, saved with save_pretrained, loads into ours and gives the same last
hidden state, pooled output and logits (fp32, <= 1e-5) at its native size and at other ones
(`interpolate_pos_encoding=True` on its side; DINOv3's rotary positions need none; MAE with `mask_ratio=0` and an
increasing `noise`, so that it keeps every patch in order; AIMv2 runs at its native size only)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Aimv2Config,
    Aimv2Model,
    Aimv2VisionConfig,
    Aimv2VisionModel,
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
    DINOv3ViTConfig,
    DINOv3ViTModel,
    MetaClip2Config,
    MetaClip2Model,
    MetaClip2VisionConfig,
    MetaClip2VisionModel,
    SiglipConfig,
    SiglipForImageClassification,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
    ViTMAEConfig,
    ViTMAEForPreTraining,
    ViTMAEModel,
    ViTMSNConfig,
    ViTMSNForImageClassification,
    ViTMSNModel,
)

from vit_ft import ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

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
MAE_DECODER = {"decoder_hidden_size": 16, "decoder_num_hidden_layers": 1, "decoder_num_attention_heads": 2,
               "decoder_intermediate_size": 32}  # fmt: skip
# DINOv3's large sizes: the gated MLP (SiLU); its key projection has no bias (key_bias=False, its default)
DINOV3 = {**VISION, "num_register_tokens": 2}
DINOV3_GATED = {**DINOV3, "use_gated_mlp": True, "hidden_act": "silu"}


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
        "mae": ViTMAEModel(ViTMAEConfig(**VISION, mask_ratio=0.0)),
        "msn": ViTMSNModel(ViTMSNConfig(**VISION)),
        "msn_classifier": ViTMSNForImageClassification(ViTMSNConfig(**VISION, **LABELS)),
        "metaclip2_vision": MetaClip2VisionModel(MetaClip2VisionConfig(**VISION)),
        "metaclip2": MetaClip2Model(
            MetaClip2Config(vision_config=VISION, text_config={**TEXT, "vocab_size": 50})
        ),
        "dinov3": DINOv3ViTModel(DINOv3ViTConfig(**DINOV3)),
        "dinov3_gated": DINOv3ViTModel(DINOv3ViTConfig(**DINOV3_GATED)),
        # AIMv2: RMSNorm, SwiGLU, no class token, its attention-pooling head; without biases (its default) or with
        "aimv2_vision": Aimv2VisionModel(Aimv2VisionConfig(**VISION)),
        "aimv2_biases": Aimv2VisionModel(Aimv2VisionConfig(**VISION, qkv_bias=True, mlp_bias=True)),
        "aimv2": Aimv2Model(Aimv2Config(vision_config=VISION, text_config={**TEXT, "vocab_size": 50})),
    }


def save_references(models: dict[str, torch.nn.Module], tmp_path_factory) -> dict[str, tuple[str, torch.nn.Module]]:
    """Each reference saved by transformers into its own folder: name -> (folder, the reference in eval mode)."""
    out = {}
    for seed, (name, model) in enumerate(models.items()):
        folder = tmp_path_factory.mktemp(name)
        randomize(model, seed=seed).save_pretrained(folder)
        out[name] = (str(folder), model)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, torch.nn.Module]]:
    return save_references(references(), tmp_path_factory)


def reference_inputs(name: str, pixels: torch.Tensor) -> dict[str, torch.Tensor | bool]:
    """What the reference needs besides the pixels to compute what ours does at any size."""
    if name.startswith(("dinov3", "aimv2")):  # rotary positions: any size as it is; AIMv2: its native size only
        return {}
    if name == "mae":  # increasing noise: MAE's shuffle keeps every patch in order (mask_ratio 0 keeps them all)
        patches = (pixels.shape[2] // 4) * (pixels.shape[3] // 4)
        return {"interpolate_pos_encoding": True, "noise": torch.arange(patches).float().expand(len(pixels), -1)}
    return {"interpolate_pos_encoding": True}


def reference_outputs(name: str, model: torch.nn.Module, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The reference's last hidden state, pooled output and logits, in the terms our model gives them."""
    with torch.no_grad():
        if name in ("clip", "siglip", "metaclip2", "aimv2"):  # the image-text model: its vision tower
            model = model.vision_model
        out = model(pixels, output_hidden_states=True, **reference_inputs(name, pixels))
    if hasattr(out, "logits"):
        return {"logits": out.logits}
    result = {"last_hidden_state": out.last_hidden_state}
    if name.startswith(("clip", "metaclip2")):  # CLIP's last hidden state is before post_layernorm; ours after
        result["last_hidden_state"] = model.post_layernorm(out.last_hidden_state)
    # DeiT's pooler is the pre-logits dense layer we discard; MAE and MSN have none (ours: the class token)
    if not name.startswith(("deit", "mae", "msn")):
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
    if name.startswith("aimv2") and size != NATIVE:
        pytest.skip("transformers' Aimv2VisionModel runs at its native size only (fixed position ids)")
    assert_parity(checkpoints, name, (size, size))


@pytest.mark.parametrize("name", ["dinov3", "dinov3_gated", "mae", "metaclip2_vision"])
@pytest.mark.parametrize("size", [(20, 28), (8, 32)])
def test_family_parity_at_other_shapes(checkpoints, name, size):
    """Rotary positions at any multiple of the patch (no table to resample); learned and fixed tables resampled
    to a non-square grid as the reference does."""
    assert_parity(checkpoints, name, size)


def assert_parity(checkpoints, name: str, size: tuple[int, int]) -> None:
    folder, reference = checkpoints[name]
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    expected = reference_outputs(name, reference, pixels)
    model, out = our_outputs(folder, "logits" in expected, pixels)
    assert model.loading_report.newly_initialized == []
    for key, value in expected.items():
        assert getattr(out, key).shape == value.shape, key
        torch.testing.assert_close(getattr(out, key), value, atol=1e-5, rtol=0, msg=f"{name} {key}")


@pytest.mark.parametrize("augment", [{}, {"pos_embed_shift": 0.3, "pos_embed_jitter": 1.5, "pos_embed_rescale": 1.8}])
def test_dinov3_training_mode_moves_the_rotary_positions_as_transformers_does(tmp_path, augment):
    """In training mode DINOv3 draws a random shift, stretch and scale of the patch centres (transformers'
    default: rescale 2 alone); with the same seed our step draws the same ones, so the outputs match, and two
    steps differ (in eval mode they are equal)."""
    reference = randomize(DINOv3ViTModel(DINOv3ViTConfig(**DINOV3, **augment)), seed=3)
    reference.save_pretrained(tmp_path)
    ours = ViTFTModel.from_pretrained(tmp_path)
    assert (ours.config.rope_shift, ours.config.rope_jitter, ours.config.rope_rescale) == (
        augment.get("pos_embed_shift"), augment.get("pos_embed_jitter"), augment.get("pos_embed_rescale", 2.0))
    pixels = torch.randn(2, 3, 20, 28, generator=torch.Generator().manual_seed(0))
    outputs = []
    for model in (reference.train(), ours.train(), ours):
        torch.manual_seed(7 if len(outputs) < 2 else 8)
        with torch.no_grad():
            outputs.append(model(pixels).last_hidden_state)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=0)
    assert (outputs[2] - outputs[1]).abs().max() > 1e-3  # another draw, another rotation
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(pixels).last_hidden_state, reference.eval()(pixels).last_hidden_state,
                                   atol=1e-5, rtol=0)  # fmt: skip


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


def test_mae_fine_tuning_layout_pools_then_normalises(checkpoints):
    """MAE's fine-tuning layout (pooling "mean", `fc_norm`): the patch-token mean of the blocks' output, then a
    LayerNorm of its own (new, as MAE's fine-tuning starts it); the checkpoint's per-token norm is discarded."""
    folder, reference = checkpoints["mae"]
    model = ViTFTModel.from_pretrained(folder, pooling="mean", fc_norm=True).eval()
    report = model.loading_report
    assert report.newly_initialized == ["fc_norm.weight", "fc_norm.bias"]
    assert list(report.discarded) == ["layernorm.* (2 tensors)"] and model.layernorm is None
    randomize(model.fc_norm, seed=5)
    pixels = torch.randn(2, 3, NATIVE, NATIVE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        blocks = reference(pixels, output_hidden_states=True, **reference_inputs("mae", pixels)).hidden_states[-1]
        expected = model.fc_norm(blocks[:, 1:].mean(dim=1))
        out = model(pixels)
    torch.testing.assert_close(out.last_hidden_state, blocks, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.pooler_output, expected, atol=1e-5, rtol=0)


def test_mae_pretraining_checkpoint_discards_its_decoder(tmp_path):
    """facebook/vit-mae-* are ViTMAEForPreTraining: the encoder loads, the pixel decoder is one report line."""
    randomize(ViTMAEForPreTraining(ViTMAEConfig(**VISION, **MAE_DECODER))).save_pretrained(tmp_path)
    report = ViTFTForImageClassification.from_pretrained(tmp_path, num_labels=2).loading_report
    assert report.newly_initialized == ["classifier.weight", "classifier.bias"]
    assert [key.split(" ")[0] for key in report.discarded] == ["decoder.*"], report.discarded


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"use_gated_mlp": True, "hidden_act": "gelu"}, "sets hidden_act otherwise"),
        ({"query_bias": False}, "sets query_bias otherwise"),
        ({"mlp_bias": False}, "sets mlp_bias otherwise"),
    ],
)
def test_dinov3_variants_vit_ft_cannot_hold_are_one_line(tmp_path, change, match):
    DINOv3ViTModel(DINOv3ViTConfig(**{**DINOV3, **change})).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=match) as error:
        ViTFTModel.from_pretrained(tmp_path)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)


def test_aimv2_native_resolution_checkpoints_are_one_line(tmp_path):
    Aimv2VisionModel(Aimv2VisionConfig(**VISION, is_native=True)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is_native=true") as error:
        ViTFTModel.from_pretrained(tmp_path)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)


def test_loading_report_says_what_each_newer_layout_became(checkpoints):
    """Beyond renames: DINOv3's missing key bias and gated MLP, its rotary positions, AIMv2's packed head."""
    dinov3 = str(ViTFTModel.from_pretrained(checkpoints["dinov3_gated"][0]).loading_report)
    assert "mapped no key bias -> attention.qkv: zeros" in dinov3
    assert "mapped mlp.gate_proj + mlp.up_proj -> mlp.fc1: packed, gate first" in dinov3
    assert "mapped positions: 2-D rotary (rope_theta=100)" in dinov3
    aimv2 = str(ViTFTModel.from_pretrained(checkpoints["aimv2_vision"][0]).loading_report)
    assert "mapped head.k_proj + head.v_proj -> attn_pool.kv: packed, key then value" in aimv2
    assert "rotary" not in aimv2 and "key bias" not in aimv2
