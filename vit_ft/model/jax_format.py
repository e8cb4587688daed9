"""The ViT paper's JAX `.npz` files (google-research/vision_transformer, e.g. `ViT-B_16.npz`) -> ours.

The files carry no config: the architecture is read from the arrays' shapes (`jax_config_fields`), and the arrays
become our state dict (`convert_jax_state_dict`), which transformers' `from_pretrained` then loads as any
`state_dict=` (`loading.py`), so resampling, the head rule and the loading report are the same as for other
formats. Unknown arrays and what a plain ViT cannot hold are refused, naming them.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


__all__ = [
    "JAX_BLOCK_KEYS",
    "JAX_KEYS",
    "JAX_NORMALIZATION",
    "convert_jax_state_dict",
    "find_jax_checkpoint",
    "jax_config_fields",
    "load_npz",
    "read_npz_shapes",
]
