"""Loading beyond transformers' own, installed on the model and config classes when vit_ft is imported.

The model and config files know no checkpoint format; they offer two public hooks, set here:
- `ViTFTConfig.checkpoint_reader`: a transformers ViT, timm or JAX config read as ours (`formats.py`);
- `ViTFTPreTrainedModel.checkpoint_loader`: `from_pretrained` of a JAX `.npz` (converted to a state dict first,
  `jax_format.py`), the checkpoint's format, grid and labels for the loading ops, and the loading report
  (`loading_report.py`) as the model's `loading_report` attribute;
and the weight conversion (`weight_mapping.py`) is registered with transformers for model_type "vit_ft". A saved
folder's copy of the model code has neither hook and loads as any transformers model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch import nn
from transformers import PretrainedConfig
from transformers.conversion_mapping import register_checkpoint_conversion_mapping

from .checkpoint_checks import check_complete, model_shapes
from .configuration_vit_ft import ViTFTConfig
from .formats import DOWNLOAD_KWARGS, checkpoint_info, read_checkpoint_config, read_config_dict
from .jax_format import (
    convert_jax_state_dict,
    find_jax_checkpoint,
    jax_config_fields,
    load_npz,
    read_npz_shapes,
)
from .loading_report import ActiveLoad, active_load, build_loading_report, loading
from .modeling_vit_ft import ViTFTPreTrainedModel
from .weight_mapping import checkpoint_conversion_mapping


class CheckpointLoader:
    """`ViTFTPreTrainedModel.checkpoint_loader`: what vit_ft adds around transformers' `from_pretrained`."""

    def from_pretrained(
        self,
        from_pretrained: Callable[..., Any],
        name_or_path: str | os.PathLike | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """transformers' `from_pretrained` (the bound method given) inside one active load. A JAX `.npz` of the ViT
        paper (the file, or a folder holding one and no config.json) is converted first and loaded as a state dict,
        with its config read from the file, so resampling, the head rule and the loading report are the same.
        `output_loading_info=True` lists the missing keys as for transformers' own ViT.

        A vit_ft folder (a fine-tune, or a backbone saved by vit_ft) loads whole: a tensor its own config has and its
        weights lack is a ValueError naming it, unless `strict=False` (torch's `load_state_dict` word), which loads
        it newly initialised and lists it in the loading report. What the caller's own arguments add (a new head for
        other labels, a pooling head the folder did not have) is new as for any checkpoint."""
        wants_info = kwargs.pop("output_loading_info", False)
        strict = kwargs.pop("strict", True)
        download = {name: kwargs[name] for name in DOWNLOAD_KWARGS if name in kwargs}
        load = ActiveLoad(ignore_mismatched_sizes=bool(kwargs.get("ignore_mismatched_sizes")))
        npz = find_jax_checkpoint(name_or_path) if kwargs.get("state_dict") is None else None
        if npz is not None:
            state_dict, load.discarded = convert_jax_state_dict(load_npz(npz), _jax_config(npz))
            kwargs.update(state_dict=state_dict, config=kwargs.get("config", str(npz)))
            name_or_path = None
        load.info = _checkpoint_info(npz or name_or_path, download)
        with loading(load):
            model, info = from_pretrained(name_or_path, *args, output_loading_info=True, **kwargs)
        info["missing_keys"] |= load.held_back  # kept out of transformers' table only
        if strict and load.info is not None and load.info.format == "vit_ft" and kwargs.get("state_dict") is None:
            _check_whole(name_or_path, info, load, download)
        if npz is not None:
            model.config.name_or_path = str(npz)
        return (model, info) if wants_info else model

    def adjust_loading_info(self, model: nn.Module, loading_info: Any) -> None:
        """After transformers' own adjustment: the loading report (loaded, resampled, the head new or kept, newly
        initialised, discarded), logged once as `model.loading_report`. A checkpoint key the model has no place
        for and that is not a known discard (the pre-logits pooler, a head this model lacks) is an error naming it.
        The missing keys the report names are held back from transformers' own table, which would list the new
        head a second time, and given back to the loading info after it."""
        load = active_load()
        model.loading_report = build_loading_report(model, loading_info, load)
        load.held_back = set(loading_info.missing_keys)
        loading_info.missing_keys = set()


def _check_whole(name_or_path: str | os.PathLike, info: dict[str, Any], load: ActiveLoad, download: Any) -> None:
    """The tensors of a vit_ft folder's own architecture (its config.json's) that its weights lack: a ValueError
    naming them (`check_complete`). A head replaced for other labels, or a module only the caller's arguments
    asked for, is new on purpose and allowed."""
    if not info["missing_keys"]:
        return
    config_dict, _, _ = read_checkpoint_config(PretrainedConfig.get_config_dict, name_or_path, **download)
    own, prefix = model_shapes(config_dict)
    if "ViTFTForImageClassification" not in (config_dict.get("architectures") or []):  # a base model's folder
        own = {key: shape for key, shape in own.items() if key.startswith(f"{prefix}.")}
    own_keys = {key.removeprefix(f"{prefix}.") for key in own}
    lacking = {
        key
        for key in info["missing_keys"]
        if key.removeprefix(f"{prefix}.") in own_keys and key.removeprefix(f"{prefix}.") not in load.replaced
    }
    problems = {"missing_keys": lacking, "unexpected_keys": set(), "mismatched_keys": set()}
    check_complete(problems, load.info.weights or str(name_or_path), fix=STRICT_FIX)


# what a Python caller may do about a vit_ft folder that lacks tensors, beyond saving it again
STRICT_FIX = "or (from Python) pass strict=False to from_pretrained to load it with them newly initialised"


def _jax_config(npz: os.PathLike) -> ViTFTConfig:
    return ViTFTConfig(**jax_config_fields(read_npz_shapes(npz), str(npz)))


def _checkpoint_info(name_or_path: str | os.PathLike | None, download: dict[str, Any]):
    """The checkpoint's format, grid and labels; None for a state dict, or where transformers' own loading must
    say what is wrong (no config there) or takes another route (a peft adapter folder)."""
    if name_or_path is None:
        return None
    try:
        return checkpoint_info(name_or_path, **download)
    except OSError:
        return None


ViTFTConfig.checkpoint_reader = staticmethod(read_config_dict)
ViTFTPreTrainedModel.checkpoint_loader = CheckpointLoader()
# transformers ViT and timm checkpoints load through transformers' own from_pretrained with this conversion
register_checkpoint_conversion_mapping(
    ViTFTConfig.model_type, checkpoint_conversion_mapping(), overwrite=True
)

__all__ = ["CheckpointLoader"]
