"""timm's ViT checkpoints (Hub repos such as `timm/vit_base_patch16_224.augreg_in21k`) <-> ours.

A timm Hub repo is a `config.json` with `architecture`, `num_classes` and `pretrained_cfg`, and `model.safetensors`
with timm's keys. Its config becomes ours here (checked against the weights' shapes); its keys are renamed while
transformers loads them (`conversion.py`, from the tables below). A plain ViT holds what timm's `VisionTransformer`
shares with it; what it cannot hold (register tokens, layer scale, no class token, other position embeddings, qk
norm, a norm before the blocks or after pooling, ...) is refused with a `ValueError` naming the feature and the fix,
never loaded half-way. The export (`export.py`) writes the other direction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from .configuration_vit_ft import ViTFTConfig
from .families import timm_family_fields
from .sizes import VIT_SIZES

# timm key -> ours, outside the blocks (timm's `pos_embed` holds the class token's slot first, as ours, with
# its default no_embed_class=False; `norm` is the final LayerNorm before the class-token pooling)
TIMM_KEYS = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
    "head.weight": "classifier.weight",
    "head.bias": "classifier.bias",
    # the family's options (timm's `attn_pool.*` has our names already)
    "reg_token": "embeddings.register_tokens",
    "dist_token": "embeddings.distillation_token",
    "norm_pre.weight": "pre_layernorm.weight",
    "norm_pre.bias": "pre_layernorm.bias",
    "head_dist.weight": "distillation_classifier.weight",
    "head_dist.bias": "distillation_classifier.bias",
}
# timm `blocks.N.ls1.gamma` -> ours `layers.N.ls1` (layer scale)
TIMM_LAYER_SCALE = {"ls1.gamma": "ls1", "ls2.gamma": "ls2"}
# timm `blocks.N.<name>` -> ours `layers.N.<name>`; timm fuses qkv (query, key, value order) as we do
TIMM_BLOCK_KEYS = {
    "norm1": "norm1",
    "attn.qkv": "attention.qkv",
    "attn.proj": "attention.proj",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
TIMM_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")
OUR_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
# timm tensors of features a plain ViT does not have: key pattern -> what it is
TIMM_UNSUPPORTED_KEYS = {
    r"\.attn\.[qk]_norm\.": "qk normalisation (qk_norm)",
    r"\.attn\.norm\.": "a norm inside attention (scale_attn_norm)",
    r"\.mlp\.norm\.": "a norm inside the MLP (scale_mlp_norm)",
    r"^fc_norm\.": "a LayerNorm after average pooling (fc_norm, global_pool='avg')",
    r"^patch_embed\.norm\.": "a norm after the patch embedding",
    # timm's packed SwiGLU (`mlp.fc1` holding gate then value: DINOv2 giant) loads; these unpacked layouts do not
    r"\.mlp\.(w12|fc1_g)\.": "an unpacked SwiGLU MLP (fc1_g/fc1_x, or DINOv2's own w12/w3)",
}
# timm's `model_args` that a plain ViT can follow, and the values it can hold (None: any value, mapped below)
TIMM_MODEL_ARGS: dict[str, tuple | None] = {
    "img_size": None,
    "patch_size": None,
    "in_chans": None,
    "num_classes": None,
    "embed_dim": None,
    "depth": None,
    "num_heads": None,
    "mlp_ratio": None,
    "qkv_bias": None,
    "global_pool": ("token", "avg", "map"),
    "fc_norm": (False, None),
    "class_token": None,
    "no_embed_class": None,
    "reg_tokens": None,
    "pos_embed": ("learn",),
    "pre_norm": None,
    "final_norm": (True,),
    "qk_norm": (False,),
    "init_values": None,
    "proj_bias": (True,),
    "act_layer": ("gelu", None, "quick_gelu", "gelu_tanh"),
    # run-time and training-only settings: our model resamples position embeddings for every input size anyway
    "dynamic_img_size": None,
    "dynamic_img_pad": (False,),
    "drop_rate": None,
    "pos_drop_rate": None,
    "patch_drop_rate": None,
    "proj_drop_rate": None,
    "attn_drop_rate": None,
    "drop_path_rate": None,
    "weight_init": None,
}
# architecture-name tags whose change leaves no tensor behind to detect it by
TIMM_UNSUPPORTED_TAGS = {
    "rope": "rotary position embeddings",
    "parallel": "parallel attention/MLP blocks",
    "relpos": "relative position embeddings",
}
TIMM_ARCHITECTURE = re.compile(
    r"^(?:vit|deit|deit3)_(?P<size>[a-z]+)_(?:distilled_)?patch(?P<patch>\d+)(?P<tags>.*)$"
)
# plain ViT names registered in timm (timm/models/vision_transformer.py), for the export's `architecture`
TIMM_REGISTERED = {
    *(f"vit_tiny_patch16_{r}" for r in (224, 384)),
    *(f"vit_small_patch{p}_{r}" for p in (16, 32) for r in (224, 384)),
    *(f"vit_base_patch{p}_{r}" for p in (16, 32) for r in (224, 384)),
    *(f"vit_large_patch{p}_{r}" for p in (16, 32) for r in (224, 384)),
    "vit_small_patch8_224",
    "vit_base_patch8_224",
    "vit_large_patch14_224",
    "vit_huge_patch14_224",
}
# timm's names of sizes beyond the ViT/DeiT ones (SigLIP's shape-optimised ViT, arXiv 2305.13035; DINOv2 giant,
# whose MLP is SwiGLU: timm's mlp_ratio 2.66667 * 2 packs 2 * 4096; its CLIP giant has other sizes, so not "giant")
TIMM_SIZES = {
    "giant_dinov2": {
        "hidden_size": 1536,
        "num_hidden_layers": 40,
        "num_attention_heads": 24,
        "intermediate_size": 4096,
    },
    "so400m": {
        "hidden_size": 1152,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "intermediate_size": 4304,
    },
}
TIMM_LAYER_NORM_EPS = 1e-6  # timm's ViT LayerNorms: partial(nn.LayerNorm, eps=1e-6), the JAX default too
FIX = "use a timm ViT without it (e.g. timm/vit_base_patch16_224.augreg_in21k) or load it with timm itself"


def is_timm_config(config_dict: dict[str, Any]) -> bool:
    """A timm Hub `config.json` names `architecture` (singular) and has no `model_type` of its own (transformers'
    config reading marks one with `pretrained_cfg` as its `timm_wrapper`)."""
    return "architecture" in config_dict and config_dict.get("model_type") in (None, "timm_wrapper")


def read_safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a safetensors file, from its header only (no tensor is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        names = f.keys()
        return {key: tuple(f.get_slice(key).get_shape()) for key in names}


def check_timm_keys(shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """Refuse a timm checkpoint whose tensors show a feature a plain ViT cannot hold, naming it."""
    for pattern, what in TIMM_UNSUPPORTED_KEYS.items():
        found = sorted(key for key in shapes if re.search(pattern, key))
        if found:
            raise ValueError(f"{source} has {what} ({found[0]}), which a plain ViT cannot hold: {FIX}.")
    needed = ("norm.weight", "blocks.0.attn.proj.bias")
    for key in (*needed, *(() if "norm_pre.weight" in shapes else ("patch_embed.proj.bias",))):
        if key not in shapes:
            raise ValueError(
                f"{source} lacks {key} (a timm option such as final_norm=False or proj_bias=False): {FIX}."
            )


def timm_config_fields(
    timm_config: dict[str, Any], shapes: dict[str, tuple[int, ...]], source: str
) -> dict[str, Any]:
    """Our config fields (transformers ViTConfig names, plus labels and pooling) for a timm checkpoint.

    The architecture name gives size and patch (`vit_base_patch16_224` -> base, 16); `model_args` override it;
    the tensors' shapes must agree. Raises `ValueError` for what a plain ViT cannot hold.
    """
    architecture = str(timm_config.get("architecture", ""))
    check_timm_keys(shapes, source)
    model_args = _check_timm_options(architecture, dict(timm_config.get("model_args") or {}), source)
    fields = _timm_size_fields(architecture, model_args, source)
    fields.update(timm_family_fields(architecture, model_args, shapes))
    if fields["mlp_type"] == "swiglu" and "mlp_ratio" in model_args:  # timm's ratio sizes fc1's packed width
        fields["intermediate_size"] //= 2
    global_pool = model_args.get("global_pool", timm_config.get("global_pool", "token"))
    if global_pool not in ("token", "avg", "map"):
        raise ValueError(
            f"{source} pools with global_pool={global_pool!r}; vit_ft pools 'token', 'avg' or 'map': {FIX}."
        )
    # 'avg' here is without fc_norm (a norm after pooling is refused above): the final norm, then the patch mean
    fields["pooling"] = {"avg": "mean", "map": "map"}.get(global_pool, "cls")
    prefix = ViTFTConfig(**fields).num_position_prefix
    fields["image_size"] = _timm_image_size(timm_config, model_args, fields, shapes, prefix)
    eps = 1e-5 if "clip" in re.split(r"[_.]", architecture) else TIMM_LAYER_NORM_EPS  # timm's CLIP norms
    fields["layer_norm_eps"] = timm_config.get("layer_norm_eps", eps)
    fields["qkv_bias"] = "blocks.0.attn.qkv.bias" in shapes
    fields.update(_timm_label_fields(timm_config, shapes))
    _check_timm_shapes(fields, shapes, source)
    fields["_drop_path_rate"] = model_args.get("drop_path_rate", 0.0)  # applied only when asked (formats.py)
    return fields


def _check_timm_options(architecture: str, model_args: dict[str, Any], source: str) -> dict[str, Any]:
    """Refuse an architecture tag or a `model_args` value a plain ViT cannot follow; `model_args` back."""
    for tag, what in TIMM_UNSUPPORTED_TAGS.items():
        if re.search(rf"(^|_){tag}(\d*)(_|$)", architecture):
            raise ValueError(f"{source} ({architecture}) uses {what}, which a plain ViT cannot hold: {FIX}.")
    for name, value in model_args.items():
        if name not in TIMM_MODEL_ARGS:
            raise ValueError(
                f"{source} sets timm model_args {name}={value!r}, which vit_ft cannot follow: {FIX}."
            )
        allowed = TIMM_MODEL_ARGS[name]
        if allowed is not None and value not in allowed:
            raise ValueError(
                f"{source} sets timm model_args {name}={value!r}; vit_ft's ViT holds only {list(allowed)}: {FIX}."
            )
    return model_args


def _timm_size_fields(architecture: str, model_args: dict[str, Any], source: str) -> dict[str, Any]:
    """Width, depth, heads, MLP size, patch and channels: from the architecture name, then `model_args`."""
    fields: dict[str, Any] = {}
    match = TIMM_ARCHITECTURE.match(architecture)
    sizes = {**VIT_SIZES, **TIMM_SIZES}
    if match:
        size = f"{match['size']}_dinov2"  # DINOv2's giant is not timm's other (CLIP) giants
        size = size if "dinov2" in match["tags"] and size in sizes else match["size"]
        if size in sizes:
            fields.update(sizes[size], patch_size=int(match["patch"]))
    named = {
        "embed_dim": "hidden_size",
        "depth": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "patch_size": "patch_size",
        "in_chans": "num_channels",
        "qkv_bias": "qkv_bias",
    }
    fields.update({ours: model_args[theirs] for theirs, ours in named.items() if theirs in model_args})
    if "mlp_ratio" in model_args:
        fields["intermediate_size"] = int(fields.get("hidden_size", 0) * model_args["mlp_ratio"])
    if "num_attention_heads" not in fields:
        raise ValueError(
            f"cannot tell the size of timm architecture {architecture!r} in {source}: vit_ft reads "
            f"vit_{{{'|'.join(VIT_SIZES)}}}_patchN_... names or model_args with embed_dim, depth and num_heads."
        )
    return fields


def _timm_image_size(
    timm_config: dict[str, Any],
    model_args: dict[str, Any],
    fields: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    prefix: int = 1,
) -> int | list[int]:
    """The stated input size (`img_size`, else `pretrained_cfg`), unless the weights' square grid disagrees."""
    pretrained_cfg = timm_config.get("pretrained_cfg") or {}
    image_size = model_args.get("img_size") or (pretrained_cfg.get("input_size") or [3, 224, 224])[1:]
    height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    patch = fields.get("patch_size", 16)
    patch = patch if isinstance(patch, int) else patch[0]
    tokens = shapes.get("pos_embed", (1, 1))[1] - prefix
    side = round(tokens**0.5)
    if side * side == tokens and (height // patch) * (width // patch) != tokens:
        height = width = side * patch  # the weights' square grid wins over a stated input size that disagrees
    return height if height == width else [height, width]


def _timm_label_fields(timm_config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """`id2label` / `label2id` for a checkpoint with a head (timm's `label_names`, else LABEL_i), else no labels."""
    pretrained_cfg = timm_config.get("pretrained_cfg") or {}
    num_classes = int(timm_config.get("num_classes", pretrained_cfg.get("num_classes", 0)) or 0)
    if "head.weight" not in shapes or num_classes <= 0:
        return {"num_labels": 0}
    names = timm_config.get("label_names")
    id2label = {
        i: str(names[i]) if names and len(names) == num_classes else f"LABEL_{i}" for i in range(num_classes)
    }
    return {"id2label": id2label, "label2id": {name: i for i, name in id2label.items()}}


def _check_timm_shapes(fields: dict[str, Any], shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """The tensors must be those of the architecture the name and model_args describe."""
    hidden, depth = fields["hidden_size"], fields["num_hidden_layers"]
    patch = fields["patch_size"]
    patch_hw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    image = fields["image_size"]
    height, width = (image, image) if isinstance(image, int) else tuple(image)
    blocks = {int(m.group(1)) for key in shapes if (m := TIMM_BLOCK.match(key))}
    prefix = ViTFTConfig(**{k: v for k, v in fields.items() if k != "image_size"}).num_position_prefix
    packed = 2 if fields["mlp_type"] == "swiglu" else 1  # timm's SwiGLUPacked: gate and value in one fc1
    expected = {
        **({"cls_token": (1, 1, hidden)} if fields.get("class_token", True) else {}),
        "pos_embed": (1, prefix + (height // patch_hw[0]) * (width // patch_hw[1]), hidden),
        "patch_embed.proj.weight": (hidden, fields.get("num_channels", 3), *patch_hw),
        "blocks.0.mlp.fc1.weight": (packed * fields["intermediate_size"], hidden),
    }
    for key, shape in expected.items():
        if shapes.get(key) != shape:
            raise ValueError(
                f"{source}: {key} has shape {shapes.get(key)} but the architecture its config.json names expects "
                f"{shape}; fix architecture / model_args in config.json to match the weights."
            )
    if blocks != set(range(depth)):
        raise ValueError(
            f"{source} has {len(blocks)} blocks but its architecture has depth {depth}; fix config.json."
        )


def to_timm_state_dict(state_dict: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Our state dict (either model, `vit.` prefix or not) -> timm `VisionTransformer` keys; the inverse of
    the renaming that loads a timm checkpoint (`conversion.checkpoint_conversion_mapping`)."""
    ours_to_timm = {ours: theirs for theirs, ours in TIMM_KEYS.items()}
    block_names = {ours: theirs for theirs, ours in TIMM_BLOCK_KEYS.items()}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        key = key.removeprefix("vit.")
        if key in ours_to_timm:
            out[ours_to_timm[key]] = tensor
        elif (match := OUR_LAYER.match(key)) and match.group(2) in block_names:
            index, name, kind = match.groups()
            out[f"blocks.{index}.{block_names[name]}.{kind}"] = tensor
        else:
            raise KeyError(f"No timm ViT equivalent for {key}.")
    return out


def timm_config_dict(config: Any, mean: list[float], std: list[float]) -> dict[str, Any]:
    """timm's Hub `config.json` for our config: `architecture` plus `model_args` that state every size, so that
    `timm.create_model(architecture, **model_args)` builds this exact ViT."""
    height, width = config.image_hw
    patch = config.patch_hw
    if patch[0] != patch[1]:
        raise ValueError(f"timm's ViT takes square patches; this model has patch_size {patch}.")
    size = next(
        (name for name, dims in VIT_SIZES.items() if all(getattr(config, k) == v for k, v in dims.items())),
        None,
    )
    architecture = f"vit_{size}_patch{patch[0]}_{height}"
    if architecture not in TIMM_REGISTERED or height != width:
        architecture = "vit_base_patch16_224"  # a name timm knows; model_args below override every size
    num_classes = max(int(config.num_labels or 0), 0)
    out: dict[str, Any] = {
        "architecture": architecture,
        "num_classes": num_classes,
        "num_features": config.hidden_size,
        "global_pool": "avg" if config.pooling == "mean" else "token",
        "model_args": {
            "img_size": height if height == width else [height, width],
            "patch_size": patch[0],
            "in_chans": config.num_channels,
            "embed_dim": config.hidden_size,
            "depth": config.num_hidden_layers,
            "num_heads": config.num_attention_heads,
            "mlp_ratio": config.intermediate_size / config.hidden_size,
            "qkv_bias": config.qkv_bias,
            "global_pool": "avg" if config.pooling == "mean" else "token",
            "fc_norm": False,  # timm's default for 'avg' is a norm after pooling; ours normalises before it
        },
        "pretrained_cfg": {
            "input_size": [config.num_channels, height, width],
            "interpolation": "bicubic",
            "crop_pct": 1.0,
            "mean": list(mean),
            "std": list(std),
            "num_classes": num_classes,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        },
    }
    if num_classes > 0:
        out["label_names"] = [config.id2label[i] for i in range(num_classes)]
    if config.layer_norm_eps != TIMM_LAYER_NORM_EPS:
        out["layer_norm_eps"] = config.layer_norm_eps  # read back by vit_ft; timm itself uses 1e-6
    return out


def timm_normalization(timm_config: dict[str, Any]) -> dict[str, list[float]]:
    """The image processor's `image_mean` / `image_std` from timm's `pretrained_cfg`, when it states them."""
    cfg = timm_config.get("pretrained_cfg") or {}
    return {
        name: list(cfg[key]) for name, key in (("image_mean", "mean"), ("image_std", "std")) if key in cfg
    }


__all__ = [
    "TIMM_BLOCK_KEYS",
    "TIMM_KEYS",
    "check_timm_keys",
    "is_timm_config",
    "read_safetensors_shapes",
    "timm_config_dict",
    "timm_config_fields",
    "timm_normalization",
    "to_timm_state_dict",
]
