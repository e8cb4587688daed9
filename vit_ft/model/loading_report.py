"""The loading report: what `from_pretrained` did with each tensor of the checkpoint, printed once per load.

While transformers loads (`loading.py` wraps its `from_pretrained`), one `ActiveLoad` per call holds what the
checkpoint is (`CheckpointInfo`, read by `formats.checkpoint_info`) and what the loading ops did (resampled, head
replaced); the report is built from it and transformers' loading info, and becomes the model's public
`loading_report` attribute. A tensor of another shape than the model's is never "newly initialised": it is an error
naming it, or, with `ignore_mismatched_sizes=True`, reported as reinitialised.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from .conversion import DISCARDED_KEYS, HEAD_KEYS
from .families import FAMILY_DISCARDS, FAMILY_MODEL_TYPES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds, for the loading ops: position embeddings are resampled from its patch grid, and a
    head is kept only for its own labels."""

    source: str
    format: str  # "vit_ft", "transformers ViTModel", "timm vit_base_patch16_224", "JAX npz", ...
    grid: tuple[int, int]
    id2label: dict[int, str] | None
    weights: str | None = None  # the safetensors weights as the user names them ("folder/model.safetensors")


@dataclass
class LoadingReport:
    """What `from_pretrained` did with each tensor of the checkpoint."""

    source: str
    source_format: str
    loaded: list[str] = field(default_factory=list)
    resampled: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    newly_initialized: list[str] = field(default_factory=list)
    # key -> (the checkpoint's shape, the model's): initialised anew, as `ignore_mismatched_sizes=True` asks (without
    # it a mismatch is an error); never among `newly_initialized`, which the checkpoint lacked
    mismatched: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    discarded: dict[str, str] = field(default_factory=dict)
    # what a family's layout became in ours, beyond a rename: "their keys -> ours" -> how (DINOv3's gated MLP...)
    mapped: dict[str, str] = field(default_factory=dict)
    # the classifier: "new" (initialised here, zero as in the paper), "kept" (the checkpoint's, same labels),
    # or None for a model without one
    head: str | None = None
    num_labels: int | None = None

    def __str__(self) -> str:
        lines = [f"Loaded {len(self.loaded)} tensors from {self.source} ({self.source_format})."]
        for key, (old, new) in self.resampled.items():
            lines.append(f"  resampled {key}: {old[0]}x{old[1]} -> {new[0]}x{new[1]} patch grid (bicubic)")
        lines += [f"  mapped {what}: {how}" for what, how in self.mapped.items()]
        if self.head == "new":
            lines.append(f"  new head: {self.num_labels} labels, zero-initialised ({', '.join(HEAD_KEYS)})")
        elif self.head == "kept":
            lines.append(f"  head kept: {self.num_labels} labels (the checkpoint's own)")
        others = [key for key in self.newly_initialized if key not in HEAD_KEYS]
        if others:
            lines.append(f"  newly initialised: {', '.join(others)}")
        for key, (saved, expected) in self.mismatched.items():
            lines.append(
                f"  reinitialised {key}: the checkpoint's is {list(saved)}, the model's {list(expected)} "
                "(ignore_mismatched_sizes=True)"
            )
        for key, why in self.discarded.items():
            lines.append(f"  discarded {key}: {why}")
        return "\n".join(lines)


@dataclass
class ActiveLoad:
    """One `from_pretrained` call while transformers loads: the checkpoint, and what the loading ops did."""

    info: CheckpointInfo | None = None
    resampled: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    mapped: dict[str, str] = field(default_factory=dict)  # a family's layout -> ours, beyond a rename
    replaced: dict[str, tuple[int, ...]] = field(default_factory=dict)  # head key -> the checkpoint's shape
    discarded: dict[str, str] = field(
        default_factory=dict
    )  # discarded before loading (a JAX pre-logits layer)
    held_back: set[str] = field(default_factory=set)  # missing keys kept out of transformers' own table
    ignore_mismatched_sizes: bool = False  # the caller's: a tensor of another shape is initialised anew
    errors: list[str] = field(default_factory=list)  # what a loading op refused, raised by the report


_ACTIVE_LOAD: ContextVar[ActiveLoad | None] = ContextVar("vit_ft_active_load", default=None)


def active_load() -> ActiveLoad:
    """The load in progress in this context; outside one (a saved folder's own code class loading while vit_ft is
    imported), an empty one, so the ops infer what they can and note it nowhere."""
    return _ACTIVE_LOAD.get() or ActiveLoad()


@contextlib.contextmanager
def loading(load: ActiveLoad) -> Iterator[ActiveLoad]:
    """Make `load` the active load for the `from_pretrained` call inside the block."""
    token = _ACTIVE_LOAD.set(load)
    try:
        yield load
    finally:
        _ACTIVE_LOAD.reset(token)


def build_loading_report(model: torch.nn.Module, loading_info: Any, load: ActiveLoad) -> LoadingReport:
    """The report of a finished `from_pretrained`, from transformers' loading info and what the ops noted.

    Known discards (the pooler, a head the model has no place for) leave `loading_info.unexpected_keys`; any
    other unexpected key raises, naming it: a checkpoint tensor is never skipped without a word.
    """
    config, info = model.config, load.info
    named = str(getattr(config, "_name_or_path", "") or "")
    source = info.source if info else named if named not in ("", "None") else "a state dict"
    if (
        load.errors
    ):  # raised here as they are; transformers' table then lists the tensors without a second error
        loading_info.conversion_errors = {}
        raise ValueError(f"{source}: {' '.join(load.errors)}")
    report = LoadingReport(source=source, source_format=info.format if info else "state dict")
    has_head = isinstance(getattr(model, "classifier", None), torch.nn.Linear)
    weights = info.weights if info is not None and info.weights else source
    report.discarded.update(_known_discards(loading_info, has_head, weights))
    report.discarded.update(load.discarded)
    for key, shape in load.replaced.items():
        report.discarded[key] = f"source head {shape} replaced by a new one (labels: {config.num_labels})"
    report.resampled, report.mapped = dict(load.resampled), dict(load.mapped)
    if getattr(config, "rope_theta", None) is not None and info is not None and info.format != "vit_ft":
        report.mapped["positions"] = (
            f"2-D rotary (rope_theta={config.rope_theta:g}), computed for any multiple of the patch: no table"
        )
    prefix = "" if not hasattr(model, "classifier") else f"{model.base_model_prefix}."
    mismatched = {
        name.removeprefix(prefix): (tuple(saved), tuple(expected))
        for name, saved, expected in sorted(loading_info.mismatched_keys)
    }
    if mismatched and not load.ignore_mismatched_sizes:
        loading_info.mismatched_keys = set()  # raised here in one line; transformers would raise after its table
        key, (saved, expected) = next(iter(mismatched.items()))
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise ValueError(
            f"{weights}: {key} has shape {list(saved)}, but the model needs {list(expected)}{more}; load it with the "
            "config it was saved with, or pass ignore_mismatched_sizes=True to initialise such tensors anew."
        )
    report.mismatched = mismatched
    missing = set(loading_info.missing_keys)
    fresh = missing | {name for name, *_ in loading_info.mismatched_keys}
    report.newly_initialized = [k.removeprefix(prefix) for k in model.state_dict() if k in missing]
    report.loaded = sorted(k.removeprefix(prefix) for k in model.state_dict() if k not in fresh)
    if has_head:
        report.num_labels = config.num_labels
        report.head = "new" if set(HEAD_KEYS) & set(report.newly_initialized) else "kept"
    logger.info("%s", report)  # the one print of a load (transformers' own table is kept empty: loading.py)
    return report


def _known_discards(loading_info: Any, has_head: bool, source: str) -> dict[str, str]:
    """The unexpected keys vit_ft drops on purpose, taken out of `loading_info`; any other one is an error."""
    discarded, unknown, groups = {}, [], {}
    heads = (*HEAD_KEYS, "distillation_classifier.weight", "distillation_classifier.bias")
    for key in sorted(loading_info.unexpected_keys):
        short = key.removeprefix("vit.")
        family = next((prefix for prefix in FAMILY_DISCARDS if short.startswith(prefix)), None)
        if short in DISCARDED_KEYS:
            discarded[short] = "pre-logits pooler, removed for fine-tuning as in the ViT paper"
        elif short in heads and not has_head:
            discarded[short] = "no head in this model"
        elif family is not None:  # one line per part (a whole text tower is one line)
            groups.setdefault(family, []).append(short)
        else:
            unknown.append(key)
    for prefix, keys in groups.items():
        name = keys[0] if len(keys) == 1 else f"{prefix}* ({len(keys)} tensors)"
        discarded[name] = FAMILY_DISCARDS[prefix]
    if unknown:
        raise ValueError(
            f"{source} has tensors this model has no place for: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}. "
            f"vit_ft loads transformers ViT and {', '.join(sorted(set(FAMILY_MODEL_TYPES.values())))} checkpoints, "
            "timm ViTs and its own folders; check that the checkpoint is one of these."
        )
    loading_info.unexpected_keys = set()
    return discarded


__all__ = ["ActiveLoad", "CheckpointInfo", "LoadingReport", "active_load", "build_loading_report", "loading"]
