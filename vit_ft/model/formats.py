"""Which format a checkpoint is in, and its config as ours: transformers ViT, timm, the paper's JAX `.npz`, ours.

One reader for all of them (`read_checkpoint_config`), used both for the config (`ViTFTConfig.from_pretrained`,
through the hook `loading.py` installs) and for what the loading ops need to know about the checkpoint
(`checkpoint_info`: its format, patch grid and labels); and the normalisation it was trained with. A Hub id is
read through transformers' own downloads (`cached_file`), so it is cached and works offline once fetched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.utils import SAFE_WEIGHTS_NAME, cached_file

from .checkpoint_checks import check_config_fits_weights
from .configuration_vit_ft import VIT_CONFIG_FIELDS, ViTFTConfig
from .families import FAMILY_MODEL_TYPES, family_config_fields, head_record, is_family_config
from .jax_format import JAX_NORMALIZATION, find_jax_checkpoint, jax_config_fields, read_npz_shapes
from .loading_report import CheckpointInfo
from .timm_format import is_timm_config, read_safetensors_shapes, timm_config_fields, timm_normalization

# transformers' download arguments, which the reader passes on to fetch a timm repo's weights header
DOWNLOAD_KWARGS = (
    "cache_dir", "force_download", "proxies", "token", "local_files_only", "revision", "subfolder",
)  # fmt: skip
# what transformers' own config reading consumes besides the download arguments
CONFIG_READING_KWARGS = ("trust_remote_code", "_from_auto", "_from_pipeline")

GetConfigDict = Callable[..., tuple[dict[str, Any], dict[str, Any]]]


def read_checkpoint_config(
    get_config_dict: GetConfigDict, name_or_path: str | os.PathLike, **kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(our config dict, the kwargs left, the checkpoint's format) for a checkpoint in any format vit_ft reads.

    `get_config_dict` is transformers' own config reading. A transformers ViT config (`model_type: vit`, e.g.
    google/vit-base-patch16-224-in21k) keeps its architecture fields, and its labels only with a head; DeiT,
    DINOv2, CLIP and SigLIP configs become ours (`families.py`); a timm `config.json` is checked against its
    weights' header; the paper's `.npz` gives sizes from its arrays' shapes. `drop_path_rate="checkpoint"` takes the
    checkpoint's own stochastic-depth rate (timm's `model_args`, DINOv2's config; 0 where it states none).
    """
    fields, kwargs, fmt = _read_checkpoint_config(get_config_dict, name_or_path, **kwargs)
    checkpoint_rate = fields.pop("_drop_path_rate", fields.get("drop_path_rate", 0.0))
    if kwargs.get("drop_path_rate") == "checkpoint":
        kwargs["drop_path_rate"] = float(checkpoint_rate or 0.0)
    return fields, kwargs, fmt


def _read_checkpoint_config(
    get_config_dict: GetConfigDict, name_or_path: str | os.PathLike, **kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any], str]:
    npz = find_jax_checkpoint(name_or_path)
    if npz is not None:  # the paper's JAX file: the architecture is read from the arrays' shapes
        for name in (*DOWNLOAD_KWARGS, *CONFIG_READING_KWARGS):
            kwargs.pop(name, None)
        return jax_config_fields(read_npz_shapes(npz), str(npz)), kwargs, "JAX npz"
    download = {name: kwargs[name] for name in DOWNLOAD_KWARGS if name in kwargs}
    config_dict, kwargs = get_config_dict(name_or_path, **kwargs)
    if not config_dict:
        return config_dict, kwargs, "vit_ft"
    if is_timm_config(config_dict):  # timm's Hub layout: the tensors' header says what the weights hold
        shapes = read_safetensors_shapes(_timm_weights(name_or_path, download))
        fields = timm_config_fields(config_dict, shapes, str(name_or_path))
        return fields, kwargs, f"timm {config_dict['architecture']}"
    model_type = config_dict.get("model_type")
    if is_family_config(config_dict):
        architecture = (config_dict.get("architectures") or [model_type])[0]
        return family_config_fields(config_dict, str(name_or_path)), kwargs, f"transformers {architecture}"
    if model_type not in ("vit", ViTFTConfig.model_type):
        raise ValueError(
            f"{name_or_path} has model_type {model_type!r}; vit_ft loads transformers ViT "
            "checkpoints (model_type 'vit', e.g. google/vit-base-patch16-224-in21k), the ViT family "
            f"({', '.join(sorted(FAMILY_MODEL_TYPES))}), timm ViTs (a config.json "
            "with 'architecture'), the ViT paper's .npz files and its own folders (model_type 'vit_ft')."
        )
    if model_type == "vit":
        architectures = config_dict.get("architectures") or ["ViTModel"]
        return _from_transformers_vit(config_dict, architectures), kwargs, f"transformers {architectures[0]}"
    return config_dict, kwargs, "vit_ft"


def _timm_weights(name_or_path: str | os.PathLike, download: dict[str, Any]) -> str:
    weights = cached_file(
        str(name_or_path), SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False, **download
    )
    if weights is None:
        raise OSError(
            f"{name_or_path} has a timm config.json but no {SAFE_WEIGHTS_NAME}: vit_ft reads "
            "timm's safetensors weights; convert the checkpoint with timm (save_file of its state_dict)."
        )
    return weights


def _from_transformers_vit(config_dict: dict[str, Any], architectures: list[str]) -> dict[str, Any]:
    """Our fields of a transformers ViTConfig: the architecture, the dtype, and the labels only with a head."""
    kept = (*VIT_CONFIG_FIELDS, "dtype", "torch_dtype")  # the dtype for from_pretrained(dtype="auto")
    fields = {name: config_dict[name] for name in kept if name in config_dict}
    if "ViTForImageClassification" in architectures and "id2label" in config_dict:
        fields.update(id2label=config_dict["id2label"], label2id=config_dict.get("label2id"))
        fields.update(head_record(config_dict))  # problem_type, a threshold, a folded temperature
    else:
        fields["num_labels"] = 0  # a backbone checkpoint: no head, no label names to carry over
    return fields


def read_config_dict(
    get_config_dict: GetConfigDict, name_or_path: str | os.PathLike, **kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`ViTFTConfig.get_config_dict` for checkpoints of any format: `read_checkpoint_config` as ours."""
    config_dict, kwargs, _ = read_checkpoint_config(get_config_dict, name_or_path, **kwargs)
    if config_dict:
        config_dict = {**config_dict, "model_type": ViTFTConfig.model_type}
    return config_dict, kwargs


def checkpoint_info(name_or_path: str | os.PathLike, **download: Any) -> CheckpointInfo | None:
    """What the checkpoint at `name_or_path` holds (format, patch grid, labels), read from its config as saved;
    None for a checkpoint without a config. A config whose sizes disagree with its weights' header (or are
    absurd) is a ValueError naming config.json and the field (`checkpoint_checks.py`)."""
    base_reading = super(ViTFTConfig, ViTFTConfig).get_config_dict  # transformers' own, without the hook
    config_dict, _, fmt = read_checkpoint_config(base_reading, name_or_path, **download)
    if not config_dict:
        return None
    weights = None
    if fmt == "vit_ft" or fmt.startswith("transformers"):  # timm's and JAX's sizes are read from the weights
        weights = check_config_fits_weights(
            config_dict, name_or_path, **download
        )  # before any layer is built
    checkpoint = ViTFTConfig(**{k: v for k, v in config_dict.items() if k != "model_type"})
    return CheckpointInfo(
        source=str(name_or_path),
        format=fmt,
        grid=checkpoint.grid_size,
        id2label=checkpoint.id2label if checkpoint.num_labels > 0 else None,
        weights=weights,
    )


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
        processor = AutoImageProcessor.from_pretrained(  # never a checkpoint's own code, never a prompt
            str(name_or_path), cache_dir=cache_dir, trust_remote_code=False
        )
    except (OSError, ValueError):
        return {}
    return {
        "image_mean": processor.image_mean,
        "image_std": processor.image_std,
        "rescale_factor": processor.rescale_factor,
    }


__all__ = [
    "DOWNLOAD_KWARGS",
    "CheckpointInfo",
    "checkpoint_info",
    "checkpoint_normalization",
    "read_checkpoint_config",
    "read_config_dict",
]
