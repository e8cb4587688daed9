"""The ViT family in transformers' layouts (DeiT, DINOv2, DINOv2 with registers, DINOv3, CLIP, MetaCLIP 2, SigLIP (2),
MAE, MSN, AIMv2) -> ours, and the family's options read from a timm checkpoint (`timm_family_fields`, for `timm_format.py`).

Each family's `config.json` (by `model_type`) becomes our config fields through transformers' own config class (so
its defaults are transformers'), and its keys are renamed by the tables below while transformers loads them
(`weight_mapping.py`). What the family holds that a fine-tune does not use (DINOv2's mask token, the text tower of a
CLIP / SigLIP checkpoint, the contrastive projections) is discarded and said so in the loading report; DINOv2
giant's SwiGLU MLP (`use_swiglu_ffn`) is our `mlp_type="swiglu"`, its packed `weights_in` our fc1 (gate first), as
are DINOv3's gated MLP's `gate_proj` and `up_proj`; DINOv3's rotary positions are our `rope_theta`; MAE's fixed
sin-cos table loads as our position table (its fine-tuning layout, mean pooling + `fc_norm`, is an option);
AIMv2's RMSNorms are our `norm_type="rmsnorm"` (with `patch_norm`), its SwiGLU `ffn` our fc1/fc2, its pooling head
our pooling "attn".
"""

from __future__ import annotations

import math
import re
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import CONFIG_MAPPING

from ..metrics.calibration import FOLDED_TEMPERATURE_ATTRIBUTE
from ..metrics.multilabel import THRESHOLD_ATTRIBUTE

# model_type -> the family's name in messages
FAMILY_MODEL_TYPES = {
    "aimv2": "AIMv2",
    "aimv2_vision_model": "AIMv2",
    "deit": "DeiT",
    "dinov2": "DINOv2",
    "dinov2_with_registers": "DINOv2 with registers",
    "dinov3_vit": "DINOv3",
    "clip": "CLIP",
    "clip_vision_model": "CLIP",
    "metaclip_2": "MetaCLIP 2",
    "metaclip_2_vision_model": "MetaCLIP 2",
    "siglip": "SigLIP",
    "siglip_vision_model": "SigLIP",
    "siglip2": "SigLIP 2",
    "siglip2_vision_model": "SigLIP 2",
    "vit_mae": "MAE",
    "vit_msn": "MSN",
}
CLIP_TYPES = ("clip", "clip_vision_model", "metaclip_2", "metaclip_2_vision_model")  # CLIP's layout
# checkpoint key prefix (each family's base model, or a key's start) -> ours; applied before the renames below
FAMILY_PREFIXES = {
    "deit.": "vit.",
    "dinov2.": "vit.",
    "dinov2_with_registers.": "vit.",
    "vision_model.": "vit.",
    # DINOv3ViTModel's keys carry no base-model name: its blocks, final norm and bare patch convolution
    "layer.": "layers.",
    "norm.": "layernorm.",
    "embeddings.patch_embeddings.weight": "embeddings.patch_embeddings.projection.weight",
    "embeddings.patch_embeddings.bias": "embeddings.patch_embeddings.projection.bias",
}
# key fragments -> ours, anywhere in a key (after the prefix): the family's names for our modules
FAMILY_RENAMES = {
    "embeddings.patch_embedding.": "embeddings.patch_embeddings.projection.",  # CLIP, SigLIP
    "embeddings.position_embedding.weight": "embeddings.position_embeddings",  # (N, hidden): reshaped on load
    "encoder.layers.": "layers.",
    "self_attn.out_proj.": "attention.proj.",
    "layer_norm1.": "norm1.",
    "layer_norm2.": "norm2.",
    "layer_scale1.lambda1": "ls1",  # DINOv2's layer scale
    "layer_scale2.lambda1": "ls2",
    "pre_layrnorm.": "pre_layernorm.",  # CLIP's spelling
    "post_layernorm.": "layernorm.",
    "cls_classifier.": "classifier.",  # DeiT with teacher: the class-token head
    "head.probe": "attn_pool.latent",  # SigLIP's attention-pooling head (its in_proj is split on load)
    "head.attention.out_proj.": "attn_pool.proj.",
    "head.layernorm.": "attn_pool.norm.",
    "head.mlp.": "attn_pool.mlp.",
    "mlp.weights_in.": "mlp.fc1.",  # DINOv2's SwiGLU: gate then value, packed as ours
    "mlp.weights_out.": "mlp.fc2.",
    "mlp.down_proj.": "mlp.fc2.",  # DINOv3's MLP (its up_proj, with gate_proj when gated, is packed on load)
    # AIMv2: its SwiGLU (then packed as DINOv3's), RMSNorms (the final one last, once the others are renamed), head
    "ffn.down_proj.": "mlp.fc2.",
    "ffn.gate_proj": "mlp.gate_proj",
    "ffn.up_proj": "mlp.up_proj",
    "attention.out_proj.": "attention.proj.",
    "embeddings.patch_embed.": "embeddings.patch_embeddings.projection.",
    "embeddings.rms_norm.": "embeddings.patch_embeddings.norm.",
    "rms_norm1.": "norm1.",
    "rms_norm2.": "norm2.",
    "rms_norm.": "layernorm.",
    "head.cls_token": "attn_pool.latent",
    "head.output_proj.": "attn_pool.proj.",
}
AIMV2_HEAD_KV = ("head.k_proj", "head.v_proj")  # AIMv2's pooling head: fused into our attn_pool.kv
# the family's query/key/value projections, fused into our qkv
FAMILY_QKV_SOURCES = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),)
SIGLIP_IN_PROJ = "head.attention.in_proj_"  # SigLIP's pooling head: split into our query and key/value
CLIP_CLASS_EMBEDDING = "embeddings.class_embedding"  # (hidden,): reshaped into our class token
# checkpoint tensors a fine-tune does not use: key prefix (ours, after renaming) -> why; reported per group
FAMILY_DISCARDS = {
    "embeddings.mask_token": "the mask token for masked-image pre-training (DINOv2, DINOv3), unused in fine-tuning",
    "decoder.": "MAE's pixel decoder for pre-training, unused in fine-tuning",
    "layernorm.": "the final LayerNorm on every token, which fc_norm after the pooling replaces (MAE's layout)",
    "text_model.": "the text tower (vit_ft loads the vision tower)",
    "text_projection.": "the text projection of the image-text model",
    "visual_projection.": "the image-text projection, unused for classification",
    "logit_scale": "the image-text model's logit scale",
    "logit_bias": "the image-text model's logit bias",
    "attn_pool.": "the attention-pooling head, which this model's pooling does not use",
}


def swiglu_width(hidden_size: int, mlp_ratio: float) -> int:
    """The SwiGLU width of transformers' `Dinov2SwiGLUFFN`: two thirds of the MLP's, rounded up to a multiple of 8."""
    return (int(int(hidden_size * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def is_family_config(config_dict: dict[str, Any]) -> bool:
    """A transformers config of a ViT family member vit_ft loads (by `model_type`)."""
    return config_dict.get("model_type") in FAMILY_MODEL_TYPES


def family_config_fields(config_dict: dict[str, Any], source: str) -> dict[str, Any]:
    """Our config fields for a DeiT / DINOv2 / CLIP / SigLIP checkpoint's `config.json`, with transformers' own
    defaults for what it leaves out; labels only with a head our model reproduces. Raises `ValueError` naming
    what our model cannot hold. The checkpoint's drop-path rate is given as `_drop_path_rate` (applied only when
    asked: `formats.read_checkpoint_config`)."""
    model_type = config_dict["model_type"]
    architecture = (config_dict.get("architectures") or [""])[0]
    settings = {k: v for k, v in config_dict.items() if k != "model_type"}
    full = _family_config(model_type, settings, source)
    vision = full.vision_config.to_dict() if hasattr(full, "vision_config") else full.to_dict()
    kept = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act")
    fields = {name: vision[name] for name in kept if name in vision}
    fields.update({name: vision[name] for name in ("patch_size", "num_channels")})
    if model_type.startswith("siglip2"):  # NaFlex: a square table of `num_patches` positions, resized per image
        side = math.isqrt(vision["num_patches"])
        fields.update(image_size=side * vision["patch_size"], max_num_patches=vision["num_patches"])
    else:
        fields["image_size"] = vision["image_size"]
    fields["layer_norm_eps"] = vision.get("layer_norm_eps", vision.get("rms_norm_eps"))  # AIMv2's is RMSNorm's
    fields["_drop_path_rate"] = vision.get("drop_path_rate", 0.0)
    if model_type.startswith("dinov2"):
        swiglu, hidden, ratio = bool(vision.get("use_swiglu_ffn")), vision["hidden_size"], vision["mlp_ratio"]
        width = swiglu_width(hidden, ratio) if swiglu else int(hidden * ratio)
        fields.update(
            intermediate_size=width,
            mlp_type="swiglu" if swiglu else "gelu",
            qkv_bias=vision["qkv_bias"],
            layerscale_value=vision["layerscale_value"],
            num_register_tokens=vision.get("num_register_tokens", 0),
            # transformers' Dinov2WithRegisters resamples its position embeddings with antialias, Dinov2 without
            pos_embed_antialias=model_type == "dinov2_with_registers",
            pooling="cls+mean" if architecture.endswith("ForImageClassification") else "cls",
        )
    elif model_type.startswith("aimv2"):
        fields.update(_aimv2_fields(vision, source))
    elif model_type == "dinov3_vit":
        fields.update(_dinov3_fields(vision, source))
    elif model_type == "deit":
        fields.update(qkv_bias=vision["qkv_bias"], distillation_token=True)
    elif model_type in ("vit_mae", "vit_msn"):  # the ViT's layout (MAE's fixed sin-cos table loads as ours)
        fields.update(qkv_bias=vision["qkv_bias"])
    elif model_type in CLIP_TYPES:
        fields.update(pre_norm=True)
    else:  # SigLIP (2): no class token, position embeddings for the patches only, attention pooling
        pooling = "map" if vision.get("vision_use_head", True) else "mean"
        if architecture in ("SiglipForImageClassification", "Siglip2ForImageClassification"):  # the token mean
            pooling = "mean"
        fields.update(class_token=False, no_embed_class=True, pooling=pooling)
    # heads our model reproduces: DeiT's two averaged heads, DINOv2's on cls+mean, SigLIP's on the token mean,
    # MSN's on the class token
    with_head = {"DeiTForImageClassificationWithTeacher", "SiglipForImageClassification",
                 "Siglip2ForImageClassification", "ViTMSNForImageClassification"}  # fmt: skip
    if (
        architecture in with_head or model_type.startswith("dinov2")
    ) and "ForImageClassification" in architecture:
        fields.update(id2label=config_dict.get("id2label"), label2id=config_dict.get("label2id"))
        fields.update(head_record(config_dict))
    else:
        fields["num_labels"] = 0
    return fields


def _dinov3_fields(vision: dict[str, Any], source: str) -> dict[str, Any]:
    """Our fields of a DINOv3 ViT config: rotary positions, registers, layer scale, the gated MLP of the large
    sizes; the biases it can leave out must be ours (a missing key bias is exact as zeros: softmax ignores it)."""
    biases = {name: vision[name] for name in ("query_bias", "value_bias", "proj_bias", "mlp_bias")}
    gated = bool(vision.get("use_gated_mlp"))
    if not all(biases.values()) or (gated and vision["hidden_act"] != "silu"):
        off = [name for name, on in biases.items() if not on] + (["hidden_act"] if gated else [])
        raise ValueError(
            f"{source}/config.json: vit_ft loads DINOv3 with query, value, output and MLP biases and a SiLU gated "
            f"MLP; this one sets {', '.join(off)} otherwise. Load a released DINOv3 ViT checkpoint."
        )
    return {
        "mlp_type": "swiglu" if gated else "gelu",
        "layerscale_value": vision["layerscale_value"],
        "num_register_tokens": vision["num_register_tokens"],
        "rope_theta": float(vision["rope_theta"]),
        # its training-time coordinate augmentations (transformers' defaults: rescale 2, no shift or jitter)
        "rope_shift": vision.get("pos_embed_shift"),
        "rope_jitter": vision.get("pos_embed_jitter"),
        "rope_rescale": vision.get("pos_embed_rescale", 2.0),
    }


def _aimv2_fields(vision: dict[str, Any], source: str) -> dict[str, Any]:
    """Our fields of an AIMv2 vision config: RMSNorms (also on the patch embeddings), a SiLU SwiGLU MLP, no class
    token, learned positions for the patches, its attention-pooling head (pooling "attn") or the token mean."""
    if vision.get("is_native") or vision["hidden_act"] != "silu":
        what = "is_native=true (sin-cos positions per image size)" if vision.get("is_native") else "hidden_act"
        raise ValueError(
            f"{source}/config.json: vit_ft loads AIMv2 at its fixed resolution with a SiLU MLP; this one sets {what}. "
            "Load one of the fixed-resolution AIMv2 checkpoints (e.g. apple/aimv2-large-patch14-224)."
        )
    return {
        "norm_type": "rmsnorm",
        "patch_norm": True,
        "mlp_type": "swiglu",
        "qkv_bias": vision["qkv_bias"],
        "proj_bias": vision["qkv_bias"],  # Aimv2Attention's out_proj follows qkv_bias
        "mlp_bias": vision["mlp_bias"],
        "class_token": False,
        "no_embed_class": True,
        "pooling": "attn" if vision.get("use_head", True) else "mean",
    }


# what an exported head's config states beyond its labels, read back by every tool (`family_export.head_fields`)
HEAD_RECORD_FIELDS = ("problem_type", THRESHOLD_ATTRIBUTE, FOLDED_TEMPERATURE_ATTRIBUTE)


def head_record(config_dict: dict[str, Any]) -> dict[str, Any]:
    """The `HEAD_RECORD_FIELDS` a transformers config dict holds (not None)."""
    return {name: config_dict[name] for name in HEAD_RECORD_FIELDS if config_dict.get(name) is not None}


def _family_config(model_type: str, settings: dict[str, Any], source: str) -> Any:
    """transformers' own config of the family from `settings`; a config its class refuses (a head count that
    does not divide the width, a validator's multi-line message naming no file) is a ValueError naming the
    checkpoint's config.json and the field."""
    config_class, fix = CONFIG_MAPPING[model_type], "restore the config.json the model was saved with."
    composite = "vision_config" in config_class.sub_configs  # CLIP, SigLIP: the vision tower's own config
    vision_class = config_class.sub_configs["vision_config"] if composite else config_class
    vision, where = (settings.get("vision_config") or {}, "vision_config.") if composite else (settings, "")
    defaults = vision_class()  # what the config leaves out, as transformers fills it in
    hidden, heads = (vision.get(name, getattr(defaults, name)) for name in ("hidden_size", "num_attention_heads"))
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads)) and hidden % heads:
        raise ValueError(
            f"{source}/config.json: {where}num_attention_heads={heads} does not divide {where}hidden_size="
            f"{hidden}; {fix}"
        )
    try:
        return config_class(**settings)
    except (ValueError, TypeError, StrictDataclassError) as error:
        cause = " ".join(str(error.__cause__ or error).split()).rstrip(".")
        family = FAMILY_MODEL_TYPES[model_type]
        raise ValueError(f"{source}/config.json is no valid {family} config ({cause}); {fix}") from error


def timm_family_fields(
    architecture: str, model_args: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> dict[str, Any]:
    """The family's options (DeiT, DeiT III, DINOv2, CLIP, SigLIP) from the tensors and the architecture's tags, as
    timm's Hub configs seldom state model_args: prefix tokens, layer scale, pre-norm, position slots, activation."""
    tags = set(re.split(r"[_.]", architecture))
    class_token, dist = "cls_token" in shapes, "dist_token" in shapes
    registers = shapes.get("reg_token", (1, 0, 0))[1]
    slots, positions = int(class_token) + int(dist), shapes.get("pos_embed", (1, 0))[1]
    square = (
        math.isqrt(positions) ** 2 == positions and math.isqrt(positions - slots) ** 2 != positions - slots
    )
    fc1, fc2 = shapes.get("blocks.0.mlp.fc1.weight", (0,)), shapes.get("blocks.0.mlp.fc2.weight", (0, 0))
    act = model_args.get("act_layer") or (
        "quick_gelu" if "quickgelu" in tags else "gelu_tanh" if "siglip" in tags else "gelu"
    )
    fields = {
        "class_token": class_token,
        "distillation_token": dist,
        "num_register_tokens": registers,
        "pre_norm": "norm_pre.weight" in shapes,
        "no_embed_class": bool(model_args.get("no_embed_class", slots > 0 and square)),
        "hidden_act": {"gelu_tanh": "gelu_pytorch_tanh"}.get(act, act),
        # timm's reg4 DINOv2 is transformers' Dinov2WithRegisters, which resamples with antialias
        "pos_embed_antialias": registers > 0 and "dinov2" in tags,
        # timm's SwiGLUPacked (DINOv2 giant): fc1 is twice as wide as fc2's input, gate then value
        "mlp_type": "swiglu" if fc2[1] and fc1[0] == 2 * fc2[1] else "gelu",
    }
    if "blocks.0.ls1.gamma" in shapes:  # the init value matters only for a fresh model; the gains are loaded
        fields["layerscale_value"] = float(model_args.get("init_values") or 1e-5)
    return fields


__all__ = [
    "CLIP_CLASS_EMBEDDING",
    "AIMV2_HEAD_KV",
    "CLIP_TYPES",
    "FAMILY_DISCARDS",
    "FAMILY_MODEL_TYPES",
    "FAMILY_PREFIXES",
    "FAMILY_QKV_SOURCES",
    "FAMILY_RENAMES",
    "SIGLIP_IN_PROJ",
    "family_config_fields",
    "is_family_config",
    "swiglu_width",
    "timm_family_fields",
]
