"""Configuration of the vit_ft Vision Transformer.

Field names follow transformers' `ViTConfig`, so that checkpoints and users' habits map without translation.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import PretrainedConfig
from transformers.utils import SAFE_WEIGHTS_NAME, cached_file

from .checkpoint_formats import (
    find_jax_checkpoint,
    is_timm_config,
    jax_config_fields,
    read_npz_shapes,
    read_safetensors_shapes,
    timm_config_fields,
)

# transformers ViTConfig fields that describe the architecture; a `model_type: vit` config keeps these
VIT_CONFIG_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps",
    "image_size", "patch_size", "num_channels", "qkv_bias",
)  # fmt: skip

# Named sizes from one table. Base/Large/Huge: ViT paper (arXiv 2010.11929) Table 1; Tiny/Small: DeiT
# (arXiv 2012.12877) Table 1, the sizes timm and "How to train your ViT" use.
VIT_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3, "intermediate_size": 768},
    "small": {
        "hidden_size": 384,
        "num_hidden_layers": 12,
        "num_attention_heads": 6,
        "intermediate_size": 1536,
    },
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "large": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
    "huge": {
        "hidden_size": 1280,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "intermediate_size": 5120,
    },
}

POOLING_CHOICES = ("cls", "mean")
# transformers' download arguments, which `get_config_dict` passes on to fetch a timm repo's weights header
DOWNLOAD_KWARGS = (
    "cache_dir", "force_download", "proxies", "token", "local_files_only", "revision", "subfolder",
)  # fmt: skip
# Patch tokens per image that the tools run without being told to: ViT-B/16 at 1024x1024. Attention's time and
# memory grow with the square of the tokens, so a typo (--image_size 4096: 65536 tokens) would run for minutes
# at many GB before anything fails. The fine-tune raises it with $VIT_FT_MAX_IMAGE_TOKENS, predict with --max_tokens.
MAX_IMAGE_TOKENS = 4096


def to_2tuple(value: int | list[int] | tuple[int, ...], name: str = "value") -> tuple[int, int]:
    """An int or an (height, width) pair as a (height, width) tuple of ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{name} must be an int or a (height, width) pair of ints, got {value!r}.")


class ViTFTConfig(PretrainedConfig):
    r"""Configuration of [`ViTFTModel`] and [`ViTFTForImageClassification`].

    The defaults are ViT-B/16 at 224x224, the architecture of google/vit-base-patch16-224-in21k. Use
    `ViTFTConfig.from_variant("large", patch_size=16)` for the other named sizes of [`VIT_SIZES`].

    Args:
        image_size: resolution the position embeddings are laid out for, an int or (height, width).
        patch_size: side of the square patches (an int; a (height, width) pair is accepted too).
        pooling: "cls" takes the CLS token (the paper's choice), "mean" averages the patch tokens.
    """

    model_type = "vit_ft"

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int | list[int] | tuple[int, int] = 16
    num_channels: int = 3
    qkv_bias: bool = True
    pooling: str = "cls"

    def __post_init__(self, **kwargs: Any) -> None:
        self._validate()
        super().__post_init__(**kwargs)

    def _validate(self) -> None:
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "num_channels",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        for name in ("image_size", "patch_size"):
            if min(to_2tuple(getattr(self, name), name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}.")
        if self.pooling not in POOLING_CHOICES:
            raise ValueError(f"pooling must be one of {POOLING_CHOICES}, got {self.pooling!r}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}.")

    @classmethod
    def get_config_dict(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """transformers' config reading, plus the mapping of a transformers ViT config (`model_type: vit`, e.g.
        google/vit-base-patch16-224-in21k), a timm ViT's `config.json` (checked against its weights' header) and
        the ViT paper's `.npz` (sizes read from the arrays' shapes) to ours (`checkpoint_formats.py`). What the
        checkpoint itself holds (format, patch grid, labels) is kept as `_checkpoint`, never saved, for the
        loading hooks: position embeddings are resampled from that grid, and a head is kept only for the same
        labels."""
        npz = find_jax_checkpoint(pretrained_model_name_or_path)
        if npz is not None:  # the paper's JAX file: the architecture is read from the arrays' shapes
            for name in (*DOWNLOAD_KWARGS, "trust_remote_code", "_from_auto", "_from_pipeline"):
                kwargs.pop(name, None)  # what transformers' own config reading consumes
            config_dict = jax_config_fields(read_npz_shapes(npz), str(npz))
            return cls._with_checkpoint_info(config_dict, pretrained_model_name_or_path, "JAX npz"), kwargs
        download = {name: kwargs[name] for name in DOWNLOAD_KWARGS if name in kwargs}
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if not config_dict:
            return config_dict, kwargs
        if is_timm_config(config_dict):  # timm's Hub layout: the tensors' header says what the weights hold
            weights = cached_file(
                str(pretrained_model_name_or_path),
                SAFE_WEIGHTS_NAME,
                _raise_exceptions_for_missing_entries=False,
                **download,
            )
            if weights is None:
                raise OSError(
                    f"{pretrained_model_name_or_path} has a timm config.json but no {SAFE_WEIGHTS_NAME}: vit_ft reads "
                    "timm's safetensors weights; convert the checkpoint with timm (save_file of its state_dict)."
                )
            shapes = read_safetensors_shapes(weights)
            fields = timm_config_fields(config_dict, shapes, str(pretrained_model_name_or_path))
            fmt = f"timm {config_dict['architecture']}"
            return cls._with_checkpoint_info(fields, pretrained_model_name_or_path, fmt), kwargs
        model_type = config_dict.get("model_type")
        if model_type not in ("vit", cls.model_type):
            raise ValueError(
                f"{pretrained_model_name_or_path} has model_type {model_type!r}; vit_ft loads transformers ViT "
                "checkpoints (model_type 'vit', e.g. google/vit-base-patch16-224-in21k), timm ViTs (a config.json "
                "with 'architecture'), the ViT paper's .npz files and its own folders (model_type 'vit_ft')."
            )
        fmt = "vit_ft"
        if model_type == "vit":
            architectures = config_dict.get("architectures") or ["ViTModel"]
            fmt = f"transformers {architectures[0]}"
            kept = (*VIT_CONFIG_FIELDS, "dtype", "torch_dtype")  # the dtype for from_pretrained(dtype="auto")
            fields = {name: config_dict[name] for name in kept if name in config_dict}
            if "ViTForImageClassification" in architectures and "id2label" in config_dict:
                fields.update(id2label=config_dict["id2label"], label2id=config_dict.get("label2id"))
            else:
                fields["num_labels"] = 0  # a backbone checkpoint: no head, no label names to carry over
            config_dict = {**fields, "model_type": cls.model_type}
        return cls._with_checkpoint_info(config_dict, pretrained_model_name_or_path, fmt), kwargs

    @classmethod
    def _with_checkpoint_info(
        cls, config_dict: dict[str, Any], source: str | os.PathLike, fmt: str
    ) -> dict[str, Any]:
        """`config_dict` (ours) with `_checkpoint`: what the checkpoint holds, for the loading hooks."""
        config_dict = {**config_dict, "model_type": cls.model_type}
        checkpoint = cls(**{k: v for k, v in config_dict.items() if k != "model_type"})
        config_dict["_checkpoint"] = {
            "source": str(source),
            "format": fmt,
            "grid": checkpoint.grid_size,
            "id2label": checkpoint.id2label if checkpoint.num_labels > 0 else None,
        }
        return config_dict

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any):
        """transformers' `from_dict`; new labels (`num_labels=` or `id2label=`) replace the checkpoint's names,
        and `label2id` follows `id2label` when it is not given."""
        if kwargs.get("num_labels") is not None or kwargs.get("id2label") is not None:
            config_dict = {k: v for k, v in config_dict.items() if k not in ("id2label", "label2id")}
            id2label = kwargs.get("id2label")
            if id2label is not None:
                if kwargs.get("num_labels") not in (None, len(id2label)):
                    raise ValueError(
                        f"num_labels={kwargs['num_labels']} but id2label has {len(id2label)} entries."
                    )
                kwargs.pop("num_labels", None)
                kwargs.setdefault("label2id", {name: int(i) for i, name in id2label.items()})
        if kwargs.get("image_size") is not None:
            kwargs["image_size"] = list(to_2tuple(kwargs["image_size"], "image_size"))
        return super().from_dict(config_dict, **kwargs)

    def _remove_keys_not_serialized(self, d: dict[str, Any]) -> None:
        super()._remove_keys_not_serialized(d)
        d.pop("_checkpoint", None)

    @property
    def image_hw(self) -> tuple[int, int]:
        """`image_size` as (height, width)."""
        return to_2tuple(self.image_size, "image_size")

    @property
    def patch_hw(self) -> tuple[int, int]:
        """`patch_size` as (height, width)."""
        return to_2tuple(self.patch_size, "patch_size")

    @property
    def grid_size(self) -> tuple[int, int]:
        """Number of patches along (height, width) at `image_size`."""
        (h, w), (ph, pw) = self.image_hw, self.patch_hw
        return (h // ph, w // pw)

    @classmethod
    def from_variant(cls, variant: str, **kwargs: Any) -> ViTFTConfig:
        """A config of a named size ("tiny", "small", "base", "large", "huge"); kwargs override fields."""
        if variant not in VIT_SIZES:
            raise ValueError(f"Unknown ViT size {variant!r}; choose one of {sorted(VIT_SIZES)}.")
        return cls(**{**VIT_SIZES[variant], **kwargs})


def nearest_multiple(image_size: tuple[int, int], patch_size: tuple[int, int]) -> tuple[int, int]:
    return tuple(max(p, round(s / p) * p) for s, p in zip(image_size, patch_size, strict=True))


__all__ = [
    "MAX_IMAGE_TOKENS",
    "VIT_CONFIG_FIELDS",
    "VIT_SIZES",
    "ViTFTConfig",
    "nearest_multiple",
    "to_2tuple",
]
