"""Checkpoint conversion between transformers' ViT layout and ours, as pure functions on state dicts.

Our layer keys differ from transformers' in two ways: query/key/value are one fused `qkv` projection, and the
modules have short names. Every source key is either renamed through the tables below or listed as
deliberately discarded; anything else is an error that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from .pos_embed import resample_position_embeddings

# transformers ViT, per encoder layer: on-disk name (the format of the Hub checkpoints and of save_pretrained)
# and the in-memory name of transformers >= 5 -> our name. q/k/v carry their slot in the fused projection.
HF_LAYER_RENAMES: dict[str, str | tuple[str, int]] = {
    "attention.attention.query": ("attention.qkv", 0),
    "attention.attention.key": ("attention.qkv", 1),
    "attention.attention.value": ("attention.qkv", 2),
    "attention.output.dense": "attention.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    # transformers >= 5 module names (state_dict() of a live model)
    "attention.q_proj": ("attention.qkv", 0),
    "attention.k_proj": ("attention.qkv", 1),
    "attention.v_proj": ("attention.qkv", 2),
    "attention.o_proj": "attention.proj",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
HF_LAYER_PREFIXES = (
    re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$"),
    re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$"),
)
# keys outside the layers that keep their name
SHARED_KEYS = (
    "embeddings.cls_token",
    "embeddings.position_embeddings",
    "embeddings.patch_embeddings.projection.weight",
    "embeddings.patch_embeddings.projection.bias",
    "layernorm.weight",
    "layernorm.bias",
)
HEAD_KEYS = ("classifier.weight", "classifier.bias")
# the pre-logits pooler of ImageNet-21k checkpoints; the paper removes it for fine-tuning (Section 3.1)
DISCARDED_KEYS = {"pooler.dense.weight": "pre-logits pooler", "pooler.dense.bias": "pre-logits pooler"}
# ours -> transformers on-disk names, for the export
EXPORT_LAYER_RENAMES = {
    "attention.proj": "attention.output.dense",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
}
QKV_EXPORT_NAMES = ("attention.attention.query", "attention.attention.key", "attention.attention.value")


def strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str = "vit.") -> dict[str, torch.Tensor]:
    """Remove the base-model prefix (`vit.`) that classification checkpoints put on encoder keys."""
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


def convert_hf_vit_state_dict(
    state_dict: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a transformers ViT state dict (ViTModel or ViTForImageClassification) to our layout.

    Returns the converted dict (base-model keys without prefix, plus `classifier.*` when present) and the
    source keys deliberately discarded (the pooler). Query/key/value weights `(hidden, hidden)` are
    concatenated into `qkv` `(3 * hidden, hidden)`. Raises `KeyError` naming any key it does not know.
    """
    state_dict = strip_prefix(state_dict)
    out: dict[str, torch.Tensor] = {}
    qkv_parts: dict[str, dict[int, torch.Tensor]] = {}
    discarded: list[str] = []
    unknown: list[str] = []
    for key, tensor in state_dict.items():
        if key in SHARED_KEYS or key in HEAD_KEYS:
            out[key] = tensor
            continue
        if key in DISCARDED_KEYS:
            discarded.append(key)
            continue
        match = next((m for p in HF_LAYER_PREFIXES if (m := p.match(key))), None)
        target = HF_LAYER_RENAMES.get(match.group(2)) if match else None
        if target is None:
            unknown.append(key)
            continue
        index, kind = match.group(1), match.group(3)
        if isinstance(target, tuple):
            name, slot = target
            qkv_parts.setdefault(f"layers.{index}.{name}.{kind}", {})[slot] = tensor
        else:
            out[f"layers.{index}.{target}.{kind}"] = tensor
    if unknown:
        raise KeyError(
            f"Unknown key(s) in the transformers ViT checkpoint: {sorted(unknown)[:10]}"
            f"{' ...' if len(unknown) > 10 else ''}. Only ViTModel / ViTForImageClassification checkpoints "
            "are supported."
        )
    for key, parts in qkv_parts.items():
        if sorted(parts) != [0, 1, 2]:
            missing = [("query", "key", "value")[i] for i in range(3) if i not in parts]
            raise KeyError(f"Checkpoint has an incomplete attention projection for {key}: missing {missing}.")
        out[key] = torch.cat([parts[0], parts[1], parts[2]], dim=0)
    return out, discarded


def to_hf_vit_state_dict(
    state_dict: dict[str, torch.Tensor], num_hidden_layers: int
) -> dict[str, torch.Tensor]:
    """Our classification state dict -> transformers `ViTForImageClassification` on-disk keys.

    The inverse of `convert_hf_vit_state_dict`: `qkv` `(3 * hidden, hidden)` is split into query/key/value.
    """
    state_dict = strip_prefix(state_dict)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key in HEAD_KEYS:
            out[key] = tensor
        elif key in SHARED_KEYS:
            out[f"vit.{key}"] = tensor
        elif match := re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", key):
            index, name, kind = match.groups()
            if int(index) >= num_hidden_layers:
                raise KeyError(f"{key} is beyond num_hidden_layers={num_hidden_layers}.")
            prefix = f"vit.encoder.layer.{index}"
            if name == "attention.qkv":
                for part_name, part in zip(QKV_EXPORT_NAMES, tensor.chunk(3, dim=0), strict=True):
                    out[f"{prefix}.{part_name}.{kind}"] = part.contiguous()
            elif name in EXPORT_LAYER_RENAMES:
                out[f"{prefix}.{EXPORT_LAYER_RENAMES[name]}.{kind}"] = tensor
            else:
                raise KeyError(f"No transformers ViT equivalent for {key}.")
        else:
            raise KeyError(f"No transformers ViT equivalent for {key}.")
    return out


@dataclass
class LoadingReport:
    """What `from_pretrained` did with each tensor of the checkpoint."""

    source: str
    source_format: str
    loaded: list[str] = field(default_factory=list)
    resampled: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    newly_initialized: list[str] = field(default_factory=list)
    discarded: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"Loaded {len(self.loaded)} tensors from {self.source} ({self.source_format})."]
        for key, (old, new) in self.resampled.items():
            lines.append(f"  resampled {key}: {old[0]}x{old[1]} -> {new[0]}x{new[1]} patch grid (bicubic)")
        if self.newly_initialized:
            lines.append(f"  newly initialised: {', '.join(self.newly_initialized)}")
        for key, why in self.discarded.items():
            lines.append(f"  discarded {key}: {why}")
        return "\n".join(lines)


def adapt_state_dict(
    state_dict: dict[str, torch.Tensor],
    expected: dict[str, torch.Size],
    source_grid: tuple[int, int],
    target_grid: tuple[int, int],
    report: LoadingReport,
    keep_head: bool,
) -> dict[str, torch.Tensor]:
    """Fit a converted state dict (our keys, no prefix) to a model whose parameters are `expected`.

    `expected` maps our unprefixed keys to shapes. Position embeddings are resampled from `source_grid` to
    `target_grid`; the classifier is kept only when `keep_head` and its shape matches, otherwise it is
    reported as newly initialised (the model's own zero init). Any other missing key or mismatched shape
    raises, naming the key.
    """
    out = dict(state_dict)
    key = "embeddings.position_embeddings"
    if key in out and source_grid != target_grid:
        out[key] = resample_position_embeddings(out[key], source_grid, target_grid)
        report.resampled[key] = (source_grid, target_grid)
    wants_head = all(k in expected for k in HEAD_KEYS)
    has_head = all(k in out for k in HEAD_KEYS)
    head_fits = has_head and wants_head and all(out[k].shape == expected[k] for k in HEAD_KEYS)
    if has_head and not (keep_head and head_fits):
        for k in HEAD_KEYS:
            source_shape = tuple(out.pop(k).shape)
            report.discarded[k] = (
                f"source head {source_shape} replaced by a new one" if wants_head else "no head in this model"
            )
    if wants_head and not (keep_head and head_fits):
        report.newly_initialized.extend(HEAD_KEYS)
    unexpected = sorted(set(out) - set(expected))
    missing = sorted(set(expected) - set(out) - set(report.newly_initialized))
    if unexpected or missing:
        raise KeyError(
            f"Checkpoint {report.source} does not fit the model: missing keys {missing[:10]}, unexpected keys "
            f"{unexpected[:10]}. Check that num_hidden_layers and the other sizes match the checkpoint."
        )
    wrong = [
        f"{k}: checkpoint {tuple(out[k].shape)} vs model {tuple(expected[k])}"
        for k in out
        if out[k].shape != expected[k]
    ]
    if wrong:
        raise ValueError(f"Shape mismatch loading {report.source}: {wrong[:10]}")
    report.loaded = sorted(out)
    return out


__all__ = [
    "LoadingReport",
    "adapt_state_dict",
    "convert_hf_vit_state_dict",
    "strip_prefix",
    "to_hf_vit_state_dict",
]
