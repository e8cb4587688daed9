"""Which transformers image-classification class a vit_ft model is exactly, and our weights in that class's names.

A model maps onto a transformers class only where that class computes the same logits: the same prefix tokens,
position slots, layer scale and, above all, the same pooling before the head. The class is picked by the model's
distinguishing options (`TARGET_RULES`), then every option that class fixes must hold (`TARGET_FIXED`):

    ViTForImageClassification                  plain ViT, pooling "cls"
    DeiTForImageClassificationWithTeacher      distillation token, pooling "cls" (the two heads averaged)
    Dinov2ForImageClassification               layer scale, pooling "cls+mean" (its linear head's input)
    Dinov2WithRegistersForImageClassification  layer scale and registers, pooling "cls+mean"
    SiglipForImageClassification               no class token, pooling "mean" (it averages all tokens)
    Siglip2ForImageClassification              NaFlex (max_num_patches), no class token, pooling "mean" (it
                                               averages the unmasked patches); its patch projection is linear

MAE and MSN checkpoints with the class token's head are ViTForImageClassification exactly (MSN's own classifier
computes the same). Nothing else maps: SigLIP's and SigLIP 2's attention-pooling head (`map`) has no place in
their classifiers (SiglipForImageClassification, Siglip2ForImageClassification); a NaFlex model of another family (a
class token) has no transformers class that takes NaFlex inputs; transformers' CLIP and MetaCLIP 2 classifiers average the patch tokens before the final
LayerNorm, which no vit_ft pooling does; DINOv3 (rotary positions) and AIMv2 (RMSNorm) have no classifier class in
transformers, nor has MAE's fine-tuning layout (`fc_norm`). Such models are shared with vit_ft's code (trust_remote_code).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig

from ..metrics.calibration import FOLDED_TEMPERATURE_ATTRIBUTE
from ..metrics.multilabel import THRESHOLD_ATTRIBUTE
from .configuration_vit_ft import VIT_CONFIG_FIELDS, ViTFTConfig
from .families import swiglu_width

VIT_CLASS = "ViTForImageClassification"
CLIP_CLASS = "CLIPForImageClassification"
DINOV3_CLASS = "DINOv3ViTModel"  # the backbone only: transformers has no DINOv3 classifier
AIMV2_CLASS = "Aimv2VisionModel"  # nor an AIMv2 one
SIGLIP2_CLASS = "Siglip2ForImageClassification"  # the one class taking NaFlex inputs
# the class a model would be, from its distinguishing options, first match wins: (option test, class)
TARGET_RULES = (
    (lambda c: c.rope_theta is not None, DINOV3_CLASS),
    (lambda c: c.max_num_patches is not None, SIGLIP2_CLASS),
    (lambda c: c.norm_type == "rmsnorm" or c.patch_norm, AIMV2_CLASS),
    (lambda c: c.pre_norm, CLIP_CLASS),
    (lambda c: c.distillation_token, "DeiTForImageClassificationWithTeacher"),
    (lambda c: c.num_register_tokens > 0, "Dinov2WithRegistersForImageClassification"),
    (lambda c: c.layerscale_value is not None, "Dinov2ForImageClassification"),
    (lambda c: not c.class_token, "SiglipForImageClassification"),
)
_PLAIN = {
    "num_register_tokens": 0,
    "distillation_token": False,
    "pre_norm": False,
    "pos_embed_antialias": False,
    "fc_norm": False,
    "rope_theta": None,
    "proj_bias": True,
    "mlp_bias": True,
}
_TOKENS = {"class_token": True, "no_embed_class": False}  # a class token with a position slot
_GELU = {"mlp_type": "gelu"}  # only DINOv2's classes hold a SwiGLU MLP (use_swiglu_ffn)
# what each class fixes: vit_ft option -> the value it must have
TARGET_FIXED: dict[str, dict[str, Any]] = {
    VIT_CLASS: {"pooling": "cls", "layerscale_value": None, **_TOKENS, **_PLAIN, **_GELU},
    "DeiTForImageClassificationWithTeacher": {
        "pooling": "cls",
        "layerscale_value": None,
        **_TOKENS,
        **_PLAIN,
        **_GELU,
        "distillation_token": True,
    },
    "Dinov2ForImageClassification": {"pooling": "cls+mean", **_TOKENS, **_PLAIN},
    # transformers' Dinov2WithRegisters resamples its position embeddings with antialias
    "Dinov2WithRegistersForImageClassification": {
        "pooling": "cls+mean",
        **_TOKENS,
        "distillation_token": False,
        "pre_norm": False,
        "pos_embed_antialias": True,
        "fc_norm": False,
        "rope_theta": None,
        "proj_bias": True,
        "mlp_bias": True,
    },
    "SiglipForImageClassification": {
        "pooling": "mean",
        "layerscale_value": None,
        "qkv_bias": True,
        **_PLAIN,
        **_GELU,
    },
    SIGLIP2_CLASS: {"pooling": "mean", "class_token": False, "layerscale_value": None, "qkv_bias": True, **_PLAIN,
                    **_GELU},  # fmt: skip
}
WHY_NOT_CLIP = (
    "transformers' CLIPForImageClassification (and MetaCLIP 2's) averages the patch tokens before the final "
    "LayerNorm, which no vit_ft pooling does"
)
WHY_NOT = {
    CLIP_CLASS: WHY_NOT_CLIP,
    DINOV3_CLASS: "transformers has no image-classification class for DINOv3's rotary ViT (DINOv3ViTModel only)",
    AIMV2_CLASS: "transformers has no image-classification class for AIMv2's RMSNorm ViT (Aimv2VisionModel only)",
}


@dataclass(frozen=True)
class Layout:
    """A transformers class's parameter names (as a live model holds them) against ours under `vit.`."""

    base: str  # the base model's attribute, e.g. "dinov2."
    layers: str  # the list of blocks under it, e.g. "encoder.layer."
    layer_names: dict[str, str]  # our names inside a block -> theirs
    qkv: tuple[str, str, str]  # our fused attention.qkv -> their query, key, value
    names: dict[str, str] = field(default_factory=dict)  # ours outside the blocks -> theirs (else the same)
    heads: dict[str, str] = field(default_factory=lambda: {"classifier.": "classifier."})
    zeros: tuple[
        str, ...
    ] = ()  # their parameters unused at inference (DINOv2's mask token), written as zeros
    # their name -> how our tensor becomes theirs, where a reshape does not (SigLIP 2's linear patch projection)
    converts: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)


_MLP = {"mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_DINOV2_LAYERS = {"norm1": "norm1", "norm2": "norm2", "attention.proj": "attention.o_proj", "ls1": "layer_scale1.lambda1",
                  "ls2": "layer_scale2.lambda1", **_MLP}  # fmt: skip
# DINOv2's SwiGLU MLP: our packed fc1 is its gate_proj then up_proj, our fc2 its down_proj
_SWIGLU_SPLIT, _SWIGLU_NAMES = {"mlp.fc1": ("mlp.gate_proj", "mlp.up_proj")}, {"mlp.fc2": "mlp.down_proj"}
_QKV = ("attention.q_proj", "attention.k_proj", "attention.v_proj")
_SIGLIP_LAYERS = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attention.proj": "self_attn.out_proj", **_MLP}
_SIGLIP_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
LAYOUTS = {
    "DeiTForImageClassificationWithTeacher": Layout(
        "deit.", "layers.",
        {"norm1": "layernorm_before", "norm2": "layernorm_after", "attention.proj": "attention.o_proj", **_MLP},
        _QKV, heads={"classifier.": "cls_classifier.", "distillation_classifier.": "distillation_classifier."},
    ),
    "Dinov2ForImageClassification": Layout(
        "dinov2.", "encoder.layer.", _DINOV2_LAYERS, _QKV, zeros=("dinov2.embeddings.mask_token",)
    ),
    "Dinov2WithRegistersForImageClassification": Layout(
        "dinov2_with_registers.", "encoder.layer.", _DINOV2_LAYERS, _QKV,
        zeros=("dinov2_with_registers.embeddings.mask_token",),
    ),
    "SiglipForImageClassification": Layout(
        "vision_model.", "encoder.layers.", _SIGLIP_LAYERS, _SIGLIP_QKV,
        names={"embeddings.patch_embeddings.projection.": "embeddings.patch_embedding.",
               "embeddings.position_embeddings": "embeddings.position_embedding.weight",  # (N, hidden) there
               "layernorm.": "post_layernorm."},
    ),
    SIGLIP2_CLASS: Layout(
        "vision_model.", "encoder.layers.", _SIGLIP_LAYERS, _SIGLIP_QKV,
        names={"embeddings.patch_embeddings.projection.": "embeddings.patch_embedding.",
               "embeddings.position_embeddings": "embeddings.position_embedding.weight",  # (N, hidden) there
               "layernorm.": "post_layernorm."},
        # a linear map over the processor's patch layout (rows, columns, channels): `naflex.patchified_projection`
        converts={"vision_model.embeddings.patch_embedding.weight": lambda w: w.permute(0, 2, 3, 1).flatten(1)},
    ),
}  # fmt: skip


def _match(config: PretrainedConfig) -> tuple[str | None, str]:
    """(the class `config` is exactly, "") or (None, why not)."""
    if getattr(config, "model_type", None) != ViTFTConfig.model_type:
        return None, f"model_type={config.model_type!r} is not vit-ft's ViT"
    if getattr(config, "num_labels", 0) < 1:
        return None, "it has no classification head (num_labels=0)"
    if getattr(config, "head_type", "linear") != "linear":  # the kNN vote, the zero-shot head's normalisation
        return None, f"its {config.head_type} head is no linear layer on the pooled feature, as transformers' are"
    if getattr(config, "vpt_tokens", 0):  # VPT's learned tokens before the blocks: no transformers class has them
        return None, f"its {config.vpt_tokens} VPT prompt tokens have no place in transformers' classes"
    target = next((name for test, name in TARGET_RULES if test(config)), VIT_CLASS)
    if target in WHY_NOT:
        return None, WHY_NOT[target]
    wrong = [
        f"{name}={getattr(config, name)!r} (it needs {value!r})"
        for name, value in TARGET_FIXED[target].items()
        if getattr(config, name) != value
    ]
    if target != VIT_CLASS and (len({*config.image_hw}) > 1 or len({*config.patch_hw}) > 1):
        wrong.append(f"image_size={config.image_size!r}, patch_size={config.patch_size!r} (it needs squares)")
    if target.startswith("Dinov2"):
        if config.layerscale_value is None:
            wrong.append("layerscale_value=None (it needs layer scale)")
        if _dinov2_mlp_ratio(config) is None:
            needs = "a SwiGLU width of an integer mlp_ratio" if config.mlp_type == "swiglu" else "a multiple"
            wrong.append(f"intermediate_size={config.intermediate_size} (it needs {needs} of hidden_size)")
    if wrong:
        return None, f"transformers' {target} cannot express {'; '.join(wrong)}"
    return target, ""


def _dinov2_mlp_ratio(config: PretrainedConfig) -> int | None:
    """DINOv2's integer `mlp_ratio` that gives `config`'s MLP width (the SwiGLU rule for mlp_type "swiglu")."""
    hidden, width = config.hidden_size, config.intermediate_size
    if config.mlp_type != "swiglu":
        return width // hidden if width % hidden == 0 else None
    return next((ratio for ratio in range(1, 17) if swiglu_width(hidden, ratio) == width), None)


def transformers_class_for(config: PretrainedConfig) -> str | None:
    """The transformers image-classification class the vit_ft classifier `config` describes is exactly (same
    logits, weights renamed), e.g. "Dinov2ForImageClassification"; None where none is
    (`transformers_export_reason` says why)."""
    return _match(config)[0]


def transformers_export_reason(config: PretrainedConfig) -> str:
    """Why no transformers class expresses the vit_ft classifier `config` describes, one clause for a sentence;
    "" where `transformers_class_for` names one."""
    return _match(config)[1]


def head_fields(config: PretrainedConfig) -> dict[str, Any]:
    """The classifier head's config fields every transformers export keeps: the label maps, `problem_type`
    (transformers' pipeline applies a sigmoid for "multi_label_classification") and, when the model has one, the
    multi-label decision threshold tuned on validation (`THRESHOLD_ATTRIBUTE`), which every tool reads, and a
    calibration temperature folded into the head (`FOLDED_TEMPERATURE_ATTRIBUTE`), which no tool divides by again."""
    fields = {"id2label": dict(config.id2label), "label2id": dict(config.label2id),
              "problem_type": config.problem_type}  # fmt: skip
    for name in (THRESHOLD_ATTRIBUTE, FOLDED_TEMPERATURE_ATTRIBUTE):  # a folded temperature: never divide twice
        if getattr(config, name, None) is not None:
            fields[name] = getattr(config, name)
    return fields


def family_config(config: ViTFTConfig, target: str) -> PretrainedConfig:
    """transformers' config of `target` (a family class of `LAYOUTS`) for the same model at its resolution."""
    from transformers import DeiTConfig, Dinov2Config, Dinov2WithRegistersConfig, Siglip2Config, SiglipConfig

    size, patch = config.image_hw[0], config.patch_hw[0]
    head = {**head_fields(config), "architectures": [target]}
    if target in ("SiglipForImageClassification", SIGLIP2_CLASS):
        vision = {name: getattr(config, name) for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_channels", "hidden_act", "layer_norm_eps")}  # fmt: skip
        vision.update(patch_size=patch, vision_use_head=False, attention_dropout=config.attention_probs_dropout_prob)
        if target == SIGLIP2_CLASS:  # the position table's size; the image size is each image's own
            return Siglip2Config(vision_config={**vision, "num_patches": (size // patch) ** 2}, **head)
        return SiglipConfig(vision_config={**vision, "image_size": size}, **head)
    fields = {
        name: getattr(config, name) for name in VIT_CONFIG_FIELDS if name not in ("image_size", "patch_size")
    }
    fields.update(image_size=size, patch_size=patch)
    if target.startswith("DeiT"):
        return DeiTConfig(**fields, **head)
    fields.pop("intermediate_size")
    fields.update(mlp_ratio=_dinov2_mlp_ratio(config), use_swiglu_ffn=config.mlp_type == "swiglu")
    fields.update(layerscale_value=config.layerscale_value, drop_path_rate=0.0)
    if target.startswith("Dinov2WithRegisters"):
        return Dinov2WithRegistersConfig(**fields, num_register_tokens=config.num_register_tokens, **head)
    return Dinov2Config(**fields, **head)


def to_family_state_dict(
    state_dict: dict[str, torch.Tensor], target: str, shapes: dict[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Our classifier's state dict -> the names of `target` (a class of `LAYOUTS`) in a live model, reshaped to
    `shapes` (the class's own parameter shapes: SigLIP keeps its position table as (N, hidden)); qkv split in
    three; the class's inference-unused parameters as zeros. A key with no place there is a KeyError naming it."""
    layout, out = LAYOUTS[target], {}
    for key, tensor in state_dict.items():
        head = next((h for h in layout.heads if key.startswith(h)), None)
        name = key.removeprefix("vit.")
        if head is not None:
            out[layout.heads[head] + key[len(head) :]] = tensor
        elif match := re.fullmatch(r"layers\.(\d+)\.(.+?)(\.weight|\.bias|)", name):
            index, module, kind = match.groups()
            prefix = f"{layout.base}{layout.layers}{index}."
            names, splits = layout.layer_names, {"attention.qkv": layout.qkv}
            if f"{prefix}mlp.gate_proj{kind}" in shapes:  # DINOv2's SwiGLU (use_swiglu_ffn)
                names, splits = {**names, **_SWIGLU_NAMES}, {**splits, **_SWIGLU_SPLIT}
            if module in splits:
                parts = tensor.chunk(len(splits[module]), dim=0)
                for part_name, part in zip(splits[module], parts, strict=True):
                    out[f"{prefix}{part_name}{kind}"] = part
            elif module in names:
                out[f"{prefix}{names[module]}{kind}"] = tensor
            else:
                raise KeyError(f"{key} has no place in transformers' {target}")
        else:
            renamed = next(
                (name.replace(s, t, 1) for s, t in layout.names.items() if name.startswith(s)), name
            )
            out[layout.base + renamed] = tensor
    out.update({key: convert(out[key]) for key, convert in layout.converts.items() if key in out})
    out.update({key: torch.zeros(shapes[key]) for key in layout.zeros})
    unknown = sorted(set(out) - set(shapes))
    if unknown:
        raise KeyError(f"{unknown[:3]} have no place in transformers' {target}")
    return {key: tensor.reshape(shapes[key]).contiguous() for key, tensor in out.items()}


__all__ = [
    "LAYOUTS",
    "SIGLIP2_CLASS",
    "TARGET_FIXED",
    "family_config",
    "head_fields",
    "to_family_state_dict",
    "transformers_class_for",
    "transformers_export_reason",
]
