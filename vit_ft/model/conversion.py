"""Checkpoint conversion between transformers' ViT layout and ours, as pure functions on state dicts.

Our layer keys differ from transformers' in two ways: query/key/value are one fused `qkv` projection, and the
modules have short names. Every source key is either renamed through the tables below or listed as
deliberately discarded; anything else is an error that names it.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.core_model_loading import Concatenate, ConversionOps, WeightConverter, WeightRenaming

from .checkpoint_formats import TIMM_BLOCK_KEYS, TIMM_KEYS
from .pos_embed import resample_position_embeddings

logger = logging.getLogger(__name__)

# transformers ViT, per encoder layer: on-disk names (the format of the Hub checkpoints and of save_pretrained)
# and the in-memory names of transformers >= 5 -> ours. Query/key/value are fused into one qkv projection, in
# that order; the other layers are renamed. Order matters: "attention.output.dense" before "output.dense".
QKV_SOURCES = (
    ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    (
        "attention.q_proj",
        "attention.k_proj",
        "attention.v_proj",
    ),  # transformers >= 5, state_dict() of a live model
)
LAYER_RENAMES = {
    "attention.output.dense": "attention.proj",
    "attention.o_proj": "attention.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
HF_LAYER_RENAMES: dict[str, str | tuple[str, int]] = {
    **{name: ("attention.qkv", slot) for names in QKV_SOURCES for slot, name in enumerate(names)},
    **LAYER_RENAMES,
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
    # the classifier: "new" (initialised here, zero as in the paper), "kept" (the checkpoint's, same labels),
    # or None for a model without one
    head: str | None = None
    num_labels: int | None = None

    def __str__(self) -> str:
        lines = [f"Loaded {len(self.loaded)} tensors from {self.source} ({self.source_format})."]
        for key, (old, new) in self.resampled.items():
            lines.append(f"  resampled {key}: {old[0]}x{old[1]} -> {new[0]}x{new[1]} patch grid (bicubic)")
        if self.head == "new":
            lines.append(f"  new head: {self.num_labels} labels, zero-initialised ({', '.join(HEAD_KEYS)})")
        elif self.head == "kept":
            lines.append(f"  head kept: {self.num_labels} labels (the checkpoint's own)")
        others = [key for key in self.newly_initialized if key not in HEAD_KEYS]
        if others:
            lines.append(f"  newly initialised: {', '.join(others)}")
        for key, why in self.discarded.items():
            lines.append(f"  discarded {key}: {why}")
        return "\n".join(lines)


# ---- loading through transformers' from_pretrained ------------------------------------------------------
# transformers applies these to every checkpoint key (renamings first, then at most one converter) before it
# loads the tensors into the model: so dtype, device_map, meta-device init, sharded and Hub checkpoints and
# the loading info are transformers' own. They only ever load: on save our keys are written as they are.


class _LoadOnly:
    """A weight transform that transformers does not reverse on save_pretrained: our folders keep our keys,
    which Trainer's checkpoint resume reads back with a plain load_state_dict."""

    def reverse_transform(self):
        targets = list(self._original_target_patterns)
        # a target with a backreference (timm's block index) matches its own output through a capturing group
        return WeightRenaming([t.replace(r"\1", r"(\d+)") for t in targets], targets)


class _Renaming(_LoadOnly, WeightRenaming):
    pass


class _Converter(_LoadOnly, WeightConverter):
    pass


def _checkpoint_info(config: Any) -> dict[str, Any] | None:
    """What the checkpoint being loaded holds (see `ViTFTConfig.get_config_dict`), when the config came from
    it; None for `config=` objects of another source and for `state_dict=` loads."""
    info = getattr(config, "_checkpoint", None)
    name = str(getattr(config, "_name_or_path", ""))
    # a JAX .npz arrives converted, as `state_dict=` with the config read from the file (name_or_path None)
    converted = info is not None and info.get("format") == "JAX npz" and name in ("", "None")
    if info is None or (info.get("source") != name and not converted):
        return None
    if converted:  # transformers clears the name for state_dict loads: give the file's back, for the report
        config.name_or_path = info["source"]
    return info


def _notes(model: torch.nn.Module) -> dict[str, dict]:
    """Where the loading ops leave what the report says (read and cleared by `build_loading_report`)."""
    return model.__dict__.setdefault("_loading_notes", {"resampled": {}, "replaced": {}})


class ResamplePositionEmbeddings(ConversionOps):
    """Resample the checkpoint's position-embedding table to the model's patch grid (`pos_embed.py`)."""

    def convert(self, input_dict, source_patterns, target_patterns, model=None, config=None, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        target = config.grid_size
        info = _checkpoint_info(config)
        source = tuple(info["grid"]) if info else target
        if tensor.shape[1] != 1 + source[0] * source[1]:  # another source: only a square grid can be inferred
            side = math.isqrt(tensor.shape[1] - 1)
            if side * side != tensor.shape[1] - 1:
                raise ValueError(
                    f"cannot tell the patch grid of position embeddings {tuple(tensor.shape)}: load from the "
                    "checkpoint's folder with image_size=... instead of passing config= or state_dict="
                )
            source = (side, side)
        if source != target:
            tensor = resample_position_embeddings(tensor, source, target)
            _notes(model)["resampled"]["embeddings.position_embeddings"] = (source, target)
        return {target_patterns[0]: tensor}


class KeepHeadForSameLabels(ConversionOps):
    """Keep a classifier only for the checkpoint's own labels; otherwise drop it, so that transformers
    initialises a new one (zero, as in the paper) and lists it as missing."""

    def convert(self, input_dict, source_patterns, target_patterns, model=None, config=None, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        name = kwargs["full_layer_name"]
        info = _checkpoint_info(config)
        same_labels = info is None or info["id2label"] == config.id2label
        if same_labels and tensor.shape == model.get_parameter(name).shape:
            return {target_patterns[0]: tensor}
        _notes(model)["replaced"][name.removeprefix("vit.")] = tuple(tensor.shape)
        return {}


def checkpoint_conversion_mapping() -> list[WeightRenaming | WeightConverter]:
    """transformers ViT checkpoints (ViTModel, ViTForImageClassification) and timm ViTs -> our modules, as
    transformers weight transforms: the tables above and timm's, the position embeddings resampled, the head
    kept for its own labels.
    Our own folders have our keys already and pass through unchanged."""
    mapping: list[WeightRenaming | WeightConverter] = [_Renaming(r"encoder\.layer\.", "layers.")]
    mapping += [
        _Renaming(rf"\.{re.escape(source)}\.", f".{target}.")
        for source, target in LAYER_RENAMES.items()
        if source != target
    ]
    # timm ViTs (checkpoint_formats.TIMM_KEYS): anchored at the key's start, so they never touch our own keys
    mapping += [_Renaming(rf"^{re.escape(source)}$", target) for source, target in TIMM_KEYS.items()]
    mapping += [
        _Renaming(rf"^blocks\.(\d+)\.{re.escape(source)}\.", rf"layers.\1.{target}.")
        for source, target in TIMM_BLOCK_KEYS.items()
    ]
    mapping += [_Converter(list(names), "attention.qkv", [Concatenate(dim=0)]) for names in QKV_SOURCES]
    mapping.append(
        _Converter(
            "embeddings.position_embeddings", "embeddings.position_embeddings", [ResamplePositionEmbeddings()]
        )
    )
    mapping += [_Converter(key, key, [KeepHeadForSameLabels()]) for key in HEAD_KEYS]
    return mapping


def build_loading_report(model: torch.nn.Module, loading_info: Any) -> LoadingReport:
    """The report of a finished `from_pretrained`, from transformers' loading info and the ops' notes.

    Known discards (the pooler, a head the model has no place for) leave `loading_info.unexpected_keys`; any
    other unexpected key raises, naming it: a checkpoint tensor is never skipped without a word.
    """
    config = model.config
    info = _checkpoint_info(config)
    notes = model.__dict__.pop("_loading_notes", {"resampled": {}, "replaced": {}})
    config.__dict__.pop("_checkpoint", None)
    source = str(getattr(config, "_name_or_path", "") or "a state dict")
    report = LoadingReport(source=source, source_format=info["format"] if info else "state dict")
    has_head = isinstance(getattr(model, "classifier", None), torch.nn.Linear)
    unknown = []
    for key in sorted(loading_info.unexpected_keys):
        short = key.removeprefix("vit.")
        if short in DISCARDED_KEYS:
            report.discarded[short] = "pre-logits pooler, removed for fine-tuning as in the ViT paper"
        elif short in HEAD_KEYS and not has_head:
            report.discarded[short] = "no head in this model"
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"{source} has tensors this model has no place for: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}. "
            "vit_ft loads transformers ViTModel / ViTForImageClassification checkpoints and its own folders; check "
            "that the checkpoint is one of these."
        )
    loading_info.unexpected_keys = set()
    for key, shape in notes["replaced"].items():
        report.discarded[key] = f"source head {shape} replaced by a new one (labels: {config.num_labels})"
    report.resampled = notes["resampled"]
    mismatched = {name for name, *_ in loading_info.mismatched_keys}
    fresh = set(loading_info.missing_keys) | mismatched
    prefix = "" if not hasattr(model, "classifier") else f"{model.base_model_prefix}."
    report.newly_initialized = [k.removeprefix(prefix) for k in model.state_dict() if k in fresh]
    report.loaded = sorted(k.removeprefix(prefix) for k in model.state_dict() if k not in fresh)
    if has_head:
        report.num_labels = config.num_labels
        report.head = "new" if set(HEAD_KEYS) & set(report.newly_initialized) else "kept"
    # the one print of a load (transformers' own table is kept empty: ViTFTPreTrainedModel._finalize_model_loading)
    logger.info("%s", report)
    return report


__all__ = [
    "LoadingReport",
    "build_loading_report",
    "checkpoint_conversion_mapping",
    "convert_hf_vit_state_dict",
    "strip_prefix",
    "to_hf_vit_state_dict",
]
