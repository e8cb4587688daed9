"""A peft model merged into a plain one: the one merge the fine-tune's save and the tools' reader share (peft is
not imported here: the model it is handed brings it)."""

from __future__ import annotations

from typing import Any

from torch import nn


def merge_adapter(peft_model: Any) -> nn.Module:
    """`peft_model.merge_and_unload()`, with any module peft left wrapped (LN tuning's merge keeps the head's
    `ModulesToSaveWrapper`) replaced by its trained copy, so that the result has a plain model's keys."""
    merged = peft_model.merge_and_unload()
    for name, module in list(merged.named_modules()):
        if hasattr(module, "original_module") and isinstance(
            getattr(module, "modules_to_save", None), nn.ModuleDict
        ):
            parent, _, child = name.rpartition(".")
            setattr(
                merged.get_submodule(parent) if parent else merged,
                child,
                module.modules_to_save[module.active_adapters[0]],
            )
    return merged


__all__ = ["merge_adapter"]
