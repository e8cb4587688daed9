"""What is checked of a model before it is built, in one place for the fine-tune and the tools: its config as
read locally, and an image size against its patch size and the token bound (that a path naming it exists is
`utils.hub_ids.check_reference`'s, through `commands.model_flags`).

`check_image_size` is the one "size is a multiple of the patch, and not too many tokens" check: the fine-tune's
`ModelArguments` ask it with the recipe's wording (`FINETUNE_WORDING`: `--image_size`, the bound raised with
$VIT_FT_MAX_IMAGE_TOKENS), the tools with theirs (`TOOL_WORDING`: `--max_tokens`). `read_local_config` is
`formats.read_checkpoint_config` (every format vit_ft reads) restricted to what is on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..utils.limits import MAX_IMAGE_TOKENS
from .configuration_vit_ft import nearest_multiple, to_2tuple
from .formats import read_checkpoint_config

MAX_IMAGE_TOKENS_ENV_VAR = "VIT_FT_MAX_IMAGE_TOKENS"
ASSUMED_PATCH = (16, 16)  # ViT's usual patch size, for checkpoints whose config is not readable locally


def read_local_config(name_or_path: str | os.PathLike, cache_dir: str | None = None) -> dict[str, Any] | None:
    """The checkpoint's config as vit_ft reads it, when it is readable on this machine (a folder, a JAX .npz or
    the HF cache), else None: the model loader reports what is wrong later."""
    from transformers import PretrainedConfig

    try:
        config, _, _ = read_checkpoint_config(
            PretrainedConfig.get_config_dict, name_or_path, cache_dir=cache_dir, local_files_only=True
        )
    except Exception:  # not cached, not a checkpoint, not even a valid repo id: all left to the loader
        return None
    return config or None


def config_patch(config: dict[str, Any] | None) -> tuple[int, int] | None:
    """The (height, width) patch size a config dict states, None when unknown."""
    try:
        return to_2tuple((config or {})["patch_size"], "patch_size")
    except (KeyError, ValueError):
        return None


def max_image_tokens() -> int:
    """The fine-tune's bound on patch tokens per image: $VIT_FT_MAX_IMAGE_TOKENS if set, else MAX_IMAGE_TOKENS."""
    value = os.environ.get(MAX_IMAGE_TOKENS_ENV_VAR, "")
    try:
        return int(value) if value.strip() else MAX_IMAGE_TOKENS
    except ValueError:
        raise ValueError(
            f"{MAX_IMAGE_TOKENS_ENV_VAR}={value!r} is not a whole number; set it to a token count such as 4096."
        ) from None


@dataclass(frozen=True)
class ImageSizeWording:
    """How a caller names the size and its fixes: format strings over h, w (the size), ph, pw (the patch),
    tokens, bound, near (the nearest multiple), options (the multiples below and above), own, name."""

    positive: str
    multiple: str
    tokens: str


TOOL_WORDING = ImageSizeWording(
    positive="image_size={h}x{w} must be positive: a number of pixels such as --image_size {own} (the model's "
    "own), or leave it unset.",
    multiple="image_size={h}x{w} is not a multiple of the model's patch size {ph}x{pw}; use e.g. --image_size "
    "{near}.",
    tokens="--image_size {h}x{w} makes {tokens} patch tokens per image ({ph}x{pw} patches), more than the bound of "
    "{bound} (ViT-B/16 at 1024 px); pass a smaller --image_size, or --max_tokens {tokens} to run it anyway "
    "(attention's cost grows with the square of the tokens).",
)
FINETUNE_WORDING = ImageSizeWording(
    positive="image_size={h} must be a positive number of pixels (e.g. 224 or 384); leave it unset to keep the "
    "checkpoint's resolution.",
    multiple="image_size={h} is not a multiple of the patch size {ph} of {name!r}: the image must split into whole "
    "{ph}x{pw} patches. Use --image_size {options}.",
    tokens="image_size={h} makes {tokens} patch tokens of {ph}x{pw} per image, above the bound of {bound} "
    f"(attention cost grows with its square). Use a smaller --image_size, or raise the bound with "
    f"{MAX_IMAGE_TOKENS_ENV_VAR}={{tokens}}.",
)


def _as_hw(size: int | Sequence[int]) -> tuple[int, int]:
    if not isinstance(size, int) and len(size) == 1:
        size = size[0]
    try:
        return to_2tuple(size if isinstance(size, int) else tuple(int(v) for v in size), "image_size")
    except (TypeError, ValueError):
        raise ValueError(f"image_size={size!r} must be one int or a (height, width) pair.") from None


def check_image_size(
    image_size: int | Sequence[int] | None,
    patch: tuple[int, int] | None,
    max_tokens: int | None = None,
    wording: ImageSizeWording = TOOL_WORDING,
    default: tuple[int, int] | None = None,
    name: str = "",
) -> tuple[int, int] | None:
    """The (height, width) to run at: `image_size`, else `default` (the model's own, not bounded). A given size
    must be positive, a multiple of `patch` (None: unknown, left to the model loader) and make at most
    `max_tokens` patch tokens (None: no bound; an unknown patch counts as 16x16). ValueError in `wording`."""
    if image_size is None:
        return default
    h, w = _as_hw(image_size)
    ph, pw = patch or ASSUMED_PATCH
    near = nearest_multiple((h, w), (ph, pw))
    lower, upper = (h // ph) * ph, (h // ph + 1) * ph
    own = default[0] if default else ""
    fields = dict(h=h, w=w, ph=ph, pw=pw, own=own, name=name, tokens=(h // ph) * (w // pw), bound=max_tokens)
    fields.update(
        near=f"{near[0]}" + ("" if near[0] == near[1] else f" (or {near[0]}x{near[1]})"),
        options=f"{lower} or {upper}" if lower > 0 else str(upper),
    )
    if min(h, w) <= 0:
        raise ValueError(wording.positive.format(**fields))
    if patch is not None and (h % ph or w % pw):
        raise ValueError(wording.multiple.format(**fields))
    if max_tokens is not None and fields["tokens"] > max_tokens:
        raise ValueError(wording.tokens.format(**fields))
    return (h, w)


__all__ = [
    "FINETUNE_WORDING",
    "MAX_IMAGE_TOKENS_ENV_VAR",
    "TOOL_WORDING",
    "ImageSizeWording",
    "check_image_size",
    "config_patch",
    "max_image_tokens",
    "read_local_config",
]
