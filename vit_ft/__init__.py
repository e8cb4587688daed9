"""vit-ft: fine-tune Vision Transformers on the Hugging Face stack.

The names below are imported on first use (PEP 562), so that `vit-ft <command> --help` and a command's first
checks answer without importing torch or transformers; importing `vit_ft.model` (which every use of a model
does) registers the model with transformers' Auto classes.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "VIT_SIZES": "vit_ft.model.sizes",
    "LoadingReport": "vit_ft.model.loading_report",
    "ViTFTConfig": "vit_ft.model.configuration_vit_ft",
    "ViTFTForImageClassification": "vit_ft.model.modeling_vit_ft",
    "ViTFTModel": "vit_ft.model.modeling_vit_ft",
    "ViTFTPreTrainedModel": "vit_ft.model.modeling_vit_ft",
    "resample_position_embeddings": "vit_ft.model.pos_embed",
    "to_hf_vit_state_dict": "vit_ft.model.conversion",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vit_ft' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
