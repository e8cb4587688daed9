"""Checkpoints of other ViT code bases -> ours, as pure functions on state dicts with explicit rename tables.

- timm's `VisionTransformer` (Hub repos such as `timm/vit_base_patch16_224.augreg_in21k`): a `config.json` with
  `architecture`, `num_classes` and `pretrained_cfg`, and `model.safetensors` with timm's keys.
- The ViT paper's JAX `.npz` files (google-research/vision_transformer, e.g. `ViT-B_16.npz`).

A plain ViT holds what these share with it; what it cannot hold (register tokens, layer scale, no class
token, other position embeddings, qk norm, a norm before the blocks or after pooling, ...) is refused with
a `ValueError` naming the feature and the fix, never loaded half-way. Nothing here imports our model or
config, so both can import it (and `save_pretrained` copies it with them for `trust_remote_code`).
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# ---- timm -------------------------------------------------------------------------------------------------

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
}
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
    r"^reg_token$": "register tokens",
    r"^dist_token$": "a distillation token (DeiT distilled)",
    r"\.ls[12]\.gamma$": "layer scale (init_values)",
    r"^norm_pre\.": "a LayerNorm before the blocks (pre_norm, as in CLIP)",
    r"\.attn\.[qk]_norm\.": "qk normalisation (qk_norm)",
    r"\.attn\.norm\.": "a norm inside attention (scale_attn_norm)",
    r"\.mlp\.norm\.": "a norm inside the MLP (scale_mlp_norm)",
    r"^attn_pool\.": "attention pooling (global_pool='map')",
    r"^fc_norm\.": "a LayerNorm after average pooling (fc_norm, global_pool='avg')",
    r"^patch_embed\.norm\.": "a norm after the patch embedding",
    r"^head_dist\.": "a distillation head (DeiT distilled)",
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
    "global_pool": ("token", "avg"),
    "fc_norm": (False, None),
    "class_token": (True,),
    "no_embed_class": (False,),
    "reg_tokens": (0,),
    "pos_embed": ("learn",),
    "pre_norm": (False,),
    "final_norm": (True,),
    "qk_norm": (False,),
    "init_values": (None,),
    "proj_bias": (True,),
    "act_layer": ("gelu", None),
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
    "quickgelu": "the QuickGELU activation (OpenAI CLIP)",
    "rope": "rotary position embeddings",
    "siglip": "SigLIP's attention pooling without a class token",
    "gap": "average pooling without a class token",
    "swiglu": "a SwiGLU MLP",
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
    if "cls_token" not in shapes:
        raise ValueError(f"{source} has no class token (class_token=False), which vit_ft's ViT needs: {FIX}.")
    for key in ("norm.weight", "patch_embed.proj.bias", "blocks.0.attn.proj.bias"):
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
    from .configuration_vit_ft import VIT_SIZES  # deferred: configuration_vit_ft imports this module

    architecture = str(timm_config.get("architecture", ""))
    check_timm_keys(shapes, source)
    for tag, what in TIMM_UNSUPPORTED_TAGS.items():
        if re.search(rf"(^|_){tag}(\d*)(_|$)", architecture):
            raise ValueError(f"{source} ({architecture}) uses {what}, which a plain ViT cannot hold: {FIX}.")
    model_args = dict(timm_config.get("model_args") or {})
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
    fields: dict[str, Any] = {}
    match = TIMM_ARCHITECTURE.match(architecture)
    if match and match["size"] in VIT_SIZES:
        fields.update(VIT_SIZES[match["size"]], patch_size=int(match["patch"]))
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
    pretrained_cfg = timm_config.get("pretrained_cfg") or {}
    image_size = model_args.get("img_size") or (pretrained_cfg.get("input_size") or [3, 224, 224])[1:]
    height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    patch = fields.get("patch_size", 16)
    patch = patch if isinstance(patch, int) else patch[0]
    tokens = shapes.get("pos_embed", (1, 1))[1] - 1
    side = round(tokens**0.5)
    if side * side == tokens and (height // patch) * (width // patch) not in (tokens, tokens + 1):
        height = width = side * patch  # the weights' square grid wins over a stated input size that disagrees
    fields["image_size"] = height if height == width else [height, width]
    global_pool = model_args.get("global_pool", timm_config.get("global_pool", "token"))
    if global_pool not in ("token", "avg"):
        raise ValueError(
            f"{source} pools with global_pool={global_pool!r}; vit_ft pools 'token' or 'avg': {FIX}."
        )
    # 'avg' here is without fc_norm (a norm after pooling is refused above): the final norm, then the patch mean
    fields["pooling"] = "mean" if global_pool == "avg" else "cls"
    fields.update(hidden_act="gelu", layer_norm_eps=timm_config.get("layer_norm_eps", TIMM_LAYER_NORM_EPS))
    fields["qkv_bias"] = "blocks.0.attn.qkv.bias" in shapes
    num_classes = int(timm_config.get("num_classes", pretrained_cfg.get("num_classes", 0)) or 0)
    if "head.weight" not in shapes:
        num_classes = 0
    names = timm_config.get("label_names")
    if num_classes > 0:
        id2label = {
            i: str(names[i]) if names and len(names) == num_classes else f"LABEL_{i}"
            for i in range(num_classes)
        }
        fields.update(id2label=id2label, label2id={name: i for i, name in id2label.items()})
    else:
        fields["num_labels"] = 0
    _check_timm_shapes(fields, shapes, source)
    return fields


def _check_timm_shapes(fields: dict[str, Any], shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """The tensors must be those of the architecture the name and model_args describe."""
    hidden, depth = fields["hidden_size"], fields["num_hidden_layers"]
    patch = fields["patch_size"]
    patch_hw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    image = fields["image_size"]
    height, width = (image, image) if isinstance(image, int) else tuple(image)
    blocks = {int(m.group(1)) for key in shapes if (m := TIMM_BLOCK.match(key))}
    expected = {
        "cls_token": (1, 1, hidden),
        "pos_embed": (1, 1 + (height // patch_hw[0]) * (width // patch_hw[1]), hidden),
        "patch_embed.proj.weight": (hidden, fields.get("num_channels", 3), *patch_hw),
        "blocks.0.mlp.fc1.weight": (fields["intermediate_size"], hidden),
    }
    for key, shape in expected.items():
        if shapes.get(key) != shape:
            why = ""
            if key == "pos_embed" and shapes.get(key, (0, 0))[1] == shape[1] - 1:
                why = " (no class-token slot: no_embed_class=True, which vit_ft's ViT cannot hold)"
            raise ValueError(
                f"{source}: {key} has shape {shapes.get(key)} but the architecture its config.json names expects "
                f"{shape}{why}; fix architecture / model_args in config.json to match the weights."
            )
    if blocks != set(range(depth)):
        raise ValueError(
            f"{source} has {len(blocks)} blocks but its architecture has depth {depth}; fix config.json."
        )


def convert_timm_state_dict(state_dict: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """timm `VisionTransformer` state dict -> ours (base-model keys without prefix, `classifier.*` from `head`).

    Every key is renamed through `TIMM_KEYS` / `TIMM_BLOCK_KEYS`; an unknown key raises `KeyError` naming it.
    Shapes are unchanged: timm already fuses qkv `(3 * hidden, hidden)` in query, key, value order.
    """
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key in TIMM_KEYS:
            out[TIMM_KEYS[key]] = tensor
        elif (match := TIMM_BLOCK.match(key)) and match.group(2) in TIMM_BLOCK_KEYS:
            index, name, kind = match.groups()
            if int(index) >= config.num_hidden_layers:
                raise KeyError(f"{key} is beyond num_hidden_layers={config.num_hidden_layers}.")
            out[f"layers.{index}.{TIMM_BLOCK_KEYS[name]}.{kind}"] = tensor
        else:
            raise KeyError(
                f"Unknown key in the timm ViT checkpoint: {key}. Only plain timm ViTs are supported."
            )
    return out


def to_timm_state_dict(state_dict: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Our state dict (either model, `vit.` prefix or not) -> timm `VisionTransformer` keys; the inverse of
    `convert_timm_state_dict`."""
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
        (name for name, dims in _sizes().items() if all(getattr(config, k) == v for k, v in dims.items())),
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


def _sizes() -> dict[str, dict[str, int]]:
    from .configuration_vit_ft import VIT_SIZES

    return VIT_SIZES


def timm_normalization(timm_config: dict[str, Any]) -> dict[str, list[float]]:
    """The image processor's `image_mean` / `image_std` from timm's `pretrained_cfg`, when it states them."""
    cfg = timm_config.get("pretrained_cfg") or {}
    return {
        name: list(cfg[key]) for name, key in (("image_mean", "mean"), ("image_std", "std")) if key in cfg
    }


# ---- the ViT paper's JAX .npz -----------------------------------------------------------------------------

# npz name -> ours outside the blocks; `layout` says how the array becomes a torch tensor
JAX_KEYS = {
    "cls": ("embeddings.cls_token", "same"),  # (1, 1, hidden)
    "Transformer/posembed_input/pos_embedding": (
        "embeddings.position_embeddings",
        "same",
    ),  # (1, 1 + N, hidden)
    "embedding/kernel": ("embeddings.patch_embeddings.projection.weight", "hwio"),  # (ph, pw, in, hidden)
    "embedding/bias": ("embeddings.patch_embeddings.projection.bias", "same"),
    "Transformer/encoder_norm/scale": ("layernorm.weight", "same"),
    "Transformer/encoder_norm/bias": ("layernorm.bias", "same"),
    "head/kernel": ("classifier.weight", "dense"),  # (hidden, classes)
    "head/bias": ("classifier.bias", "same"),
}
# npz `Transformer/encoderblock_N/<name>` -> ours `layers.N.<name>`
JAX_BLOCK_KEYS = {
    "LayerNorm_0/scale": ("norm1.weight", "same"),
    "LayerNorm_0/bias": ("norm1.bias", "same"),
    "MultiHeadDotProductAttention_1/out/kernel": (
        "attention.proj.weight",
        "heads_in",
    ),  # (heads, head_dim, hidden)
    "MultiHeadDotProductAttention_1/out/bias": ("attention.proj.bias", "same"),
    "LayerNorm_2/scale": ("norm2.weight", "same"),
    "LayerNorm_2/bias": ("norm2.bias", "same"),
    "MlpBlock_3/Dense_0/kernel": ("mlp.fc1.weight", "dense"),
    "MlpBlock_3/Dense_0/bias": ("mlp.fc1.bias", "same"),
    "MlpBlock_3/Dense_1/kernel": ("mlp.fc2.weight", "dense"),
    "MlpBlock_3/Dense_1/bias": ("mlp.fc2.bias", "same"),
}
# query/key/value kernels (hidden, heads, head_dim) and biases (heads, head_dim), fused into our qkv in this order
JAX_QKV = ("query", "key", "value")
JAX_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/(.+)$")
# the representation layer of the ImageNet-21k files: the head sits on it, and the paper removes both to fine-tune
JAX_PRE_LOGITS = ("pre_logits/kernel", "pre_logits/bias")
JAX_OPTIMIZER_PREFIX = "opt/target/"  # files saved with the optimizer state nest the parameters here


def find_jax_checkpoint(path: str | Path | None) -> Path | None:
    """The `.npz` to load: `path` itself, or the one `.npz` in a folder that has no `config.json`; else None."""
    if path is None:
        return None
    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.npz"))
        if len(found) > 1:
            raise ValueError(
                f"{path} holds several .npz files {[p.name for p in found]}: pass the one to load."
            )
        return found[0] if found else None
    return None


def read_npz_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of an `.npz`, from the array headers only."""
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            with archive.open(name) as f:
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, _ = read(f)
            shapes[name.removesuffix(".npy").removeprefix(JAX_OPTIMIZER_PREFIX)] = tuple(shape)
    return shapes


def jax_config_fields(shapes: dict[str, tuple[int, ...]], source: str) -> dict[str, Any]:
    """Our config fields for a JAX `.npz`, read from the arrays' shapes (the files carry no config)."""
    needed = ("embedding/kernel", "Transformer/posembed_input/pos_embedding", "cls")
    missing = [name for name in needed if name not in shapes]
    if missing:
        raise ValueError(
            f"{source} is not a ViT .npz of google-research/vision_transformer: it lacks {missing}. Pass a file such "
            "as ViT-B_16.npz (hybrid ResNet+ViT files are not supported)."
        )
    patch_h, patch_w, channels, hidden = shapes["embedding/kernel"]
    if shapes["cls"] != (1, 1, hidden):
        raise ValueError(f"{source}: cls has shape {shapes['cls']}, expected (1, 1, {hidden}).")
    tokens = shapes["Transformer/posembed_input/pos_embedding"][1] - 1
    side = int(round(tokens**0.5))
    if side * side != tokens:
        raise ValueError(
            f"{source}: {tokens} position embeddings are not a square patch grid plus the class token."
        )
    depth = len({int(m.group(1)) for name in shapes if (m := JAX_BLOCK.match(name))})
    _, heads, head_dim = shapes["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
    fields: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": depth,
        "num_attention_heads": heads,
        "intermediate_size": shapes["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"][1],
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-6,  # flax.linen.LayerNorm's default, as the paper's code uses it
        "image_size": side * patch_h if patch_h == patch_w else [side * patch_h, side * patch_w],
        "patch_size": patch_h if patch_h == patch_w else [patch_h, patch_w],
        "num_channels": channels,
        "qkv_bias": "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias" in shapes,
    }
    if head_dim * heads != hidden:
        raise ValueError(f"{source}: attention heads {heads} x {head_dim} do not make hidden size {hidden}.")
    if "head/kernel" in shapes and "pre_logits/kernel" not in shapes:
        classes = shapes["head/kernel"][1]
        fields["id2label"] = {i: f"LABEL_{i}" for i in range(classes)}
        fields["label2id"] = {f"LABEL_{i}": i for i in range(classes)}
    else:
        fields["num_labels"] = 0
    return fields


def _jax_to_torch(array: np.ndarray, layout: str) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array)).float()
    if layout == "hwio":  # (h, w, in, out) -> conv (out, in, h, w)
        return tensor.permute(3, 2, 0, 1).contiguous()
    if layout == "dense":  # (in, out) -> linear (out, in)
        return tensor.t().contiguous()
    if layout == "heads_in":  # (heads, head_dim, hidden) -> linear (hidden, heads * head_dim)
        return tensor.flatten(0, 1).t().contiguous()
    return tensor


def convert_jax_state_dict(
    arrays: dict[str, np.ndarray], config: Any
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The ViT paper's `.npz` arrays -> our state dict (base-model keys without prefix, `classifier.*`).

    Query/key/value kernels `(hidden, heads, head_dim)` become rows of our qkv `(3 * hidden, hidden)`; the
    attention output kernel `(heads, head_dim, hidden)` becomes `(hidden, hidden)`; the patch kernel goes from
    HWIO to OIHW and dense kernels are transposed. Returns the state dict and the names deliberately
    discarded, with why (the pre-logits layer and the head on it). Unknown names raise `KeyError`.
    """
    arrays = {name.removeprefix(JAX_OPTIMIZER_PREFIX): value for name, value in arrays.items()}
    out: dict[str, torch.Tensor] = {}
    discarded: dict[str, str] = {}
    has_pre_logits = any(name in arrays for name in JAX_PRE_LOGITS)
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    unknown = []
    for name, array in arrays.items():
        if name in JAX_PRE_LOGITS or (has_pre_logits and name.startswith("head/")):
            discarded[name] = (
                "pre-logits representation layer and the head on it, removed for fine-tuning as in the ViT paper"
            )
        elif name in JAX_KEYS:
            key, layout = JAX_KEYS[name]
            out[key] = _jax_to_torch(array, layout)
        elif match := JAX_BLOCK.match(name):
            index, rest = match.groups()
            if int(index) >= config.num_hidden_layers:
                raise KeyError(f"{name} is beyond num_hidden_layers={config.num_hidden_layers}.")
            parts = rest.split("/")
            if rest in JAX_BLOCK_KEYS:
                key, layout = JAX_BLOCK_KEYS[rest]
                out[f"layers.{index}.{key}"] = _jax_to_torch(array, layout)
            elif len(parts) == 3 and parts[0] == "MultiHeadDotProductAttention_1" and parts[1] in JAX_QKV:
                kind = "weight" if parts[2] == "kernel" else "bias"
                tensor = torch.from_numpy(np.ascontiguousarray(array)).float()
                # kernel (hidden, heads, head_dim) -> (heads * head_dim, hidden); bias (heads, head_dim) -> flat
                tensor = tensor.flatten(1).t() if kind == "weight" else tensor.reshape(-1)
                qkv.setdefault((index, kind), {})[parts[1]] = tensor
            else:
                unknown.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise KeyError(
            f"Unknown array(s) in the ViT .npz: {sorted(unknown)[:10]}. Only plain ViT files are supported."
        )
    for (index, kind), parts in qkv.items():
        missing = [name for name in JAX_QKV if name not in parts]
        if missing:
            raise KeyError(f"Block {index} of the .npz lacks attention {kind}s for {missing}.")
        out[f"layers.{index}.attention.qkv.{kind}"] = torch.cat(
            [parts[name] for name in JAX_QKV], dim=0
        ).contiguous()
    return out, discarded


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an `.npz` (no pickled objects)."""
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


JAX_NORMALIZATION = {
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}  # the paper's [-1, 1] inputs


# ---- one place for the normalisation a checkpoint was trained with ---------------------------------------


def checkpoint_normalization(name_or_path: str | Path, cache_dir: str | None = None) -> dict[str, Any]:
    """`image_mean` / `image_std` (and `rescale_factor` when stated) the checkpoint was trained with: a
    transformers image processor, timm's `pretrained_cfg`, or the paper's [-1, 1] for a JAX `.npz`. Empty when
    the checkpoint states none (the caller keeps ViT's default 0.5 / 0.5)."""
    if find_jax_checkpoint(name_or_path) is not None:
        return dict(JAX_NORMALIZATION)
    from transformers import AutoImageProcessor
    from transformers.utils import cached_file

    # timm's config first: transformers would read it as its timm_wrapper, which needs timm installed
    try:
        config_file = cached_file(
            str(name_or_path), "config.json", cache_dir=cache_dir, _raise_exceptions_for_missing_entries=False
        )
        config_dict = json.loads(Path(config_file).read_text(encoding="utf-8")) if config_file else {}
    except (OSError, ValueError):  # unreachable or unreadable: the model loader has said so already
        config_dict = {}
    if is_timm_config(config_dict):
        return timm_normalization(config_dict)
    try:
        processor = AutoImageProcessor.from_pretrained(str(name_or_path), cache_dir=cache_dir)
    except (OSError, ValueError):
        return {}
    return {
        "image_mean": processor.image_mean,
        "image_std": processor.image_std,
        "rescale_factor": processor.rescale_factor,
    }


__all__ = [
    "TIMM_BLOCK_KEYS",
    "TIMM_KEYS",
    "JAX_BLOCK_KEYS",
    "JAX_KEYS",
    "checkpoint_normalization",
    "convert_jax_state_dict",
    "convert_timm_state_dict",
    "find_jax_checkpoint",
    "is_timm_config",
    "jax_config_fields",
    "load_npz",
    "read_npz_shapes",
    "read_safetensors_shapes",
    "timm_config_dict",
    "timm_config_fields",
    "timm_normalization",
    "to_timm_state_dict",
]
