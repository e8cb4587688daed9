"""transformers' ViT layout <-> ours: the rename tables, and our state dict as transformers' keys (the export).

Our layer keys differ from transformers' in two ways: query/key/value are one fused `qkv` projection, and the
modules have short names. Loading renames through these tables (`weight_mapping.py`); every source key is either
renamed or listed as deliberately discarded, and anything else is an error that names it (`loading_report.py`).
"""

from __future__ import annotations

import re

import torch

# transformers ViT, per encoder layer: on-disk names (the format of the Hub checkpoints and of save_pretrained)
# and the in-memory names of transformers >= 5 -> ours. Query/key/value are fused into one qkv projection, in
# that order; the other layers are renamed. Order matters: "attention.output.dense" before "output.dense".
QKV_SOURCES = (
    ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    (
        "attention.q_proj",
        "attention.k_proj",
        "attention.v_proj",
    ),  # transformers >= 5, a live model's state_dict()
)
LAYER_RENAMES = {
    "attention.output.dense": "attention.proj",
    "attention.o_proj": "attention.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
}
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
# ours -> transformers on-disk names, for the export: the tables above read backwards, to the on-disk names (not
# transformers >= 5's in-memory `o_proj` / `q_proj`, `k_proj`, `v_proj`)
EXPORT_LAYER_RENAMES = {ours: theirs for theirs, ours in LAYER_RENAMES.items() if theirs != "attention.o_proj"}
QKV_EXPORT_NAMES = QKV_SOURCES[0]


def strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str = "vit.") -> dict[str, torch.Tensor]:
    """Remove the base-model prefix (`vit.`) that classification checkpoints put on encoder keys."""
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


def to_hf_vit_state_dict(
    state_dict: dict[str, torch.Tensor], num_hidden_layers: int
) -> dict[str, torch.Tensor]:
    """Our classification state dict -> transformers `ViTForImageClassification` on-disk keys.

    The inverse of loading a transformers checkpoint: `qkv` `(3 * hidden, hidden)` is split into query/key/value.
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


__all__ = [
    "DISCARDED_KEYS",
    "HEAD_KEYS",
    "LAYER_RENAMES",
    "QKV_SOURCES",
    "SHARED_KEYS",
    "strip_prefix",
    "to_hf_vit_state_dict",
]
