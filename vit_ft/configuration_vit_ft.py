"""Configuration of the vit_ft Vision Transformer.

Field names follow transformers' `ViTConfig`, so that checkpoints and users' habits map without translation.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

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
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); pick a head count that divides it, e.g. "
                f"{[h for h in range(1, 33) if self.hidden_size % h == 0][-3:]}."
            )
        image_size = to_2tuple(self.image_size, "image_size")
        patch_size = to_2tuple(self.patch_size, "patch_size")
        if min(image_size) <= 0 or min(patch_size) <= 0:
            raise ValueError(f"image_size {image_size} and patch_size {patch_size} must be positive.")
        if image_size[0] % patch_size[0] or image_size[1] % patch_size[1]:
            raise ValueError(
                f"image_size {image_size} is not divisible by patch_size {patch_size}: use a multiple of the "
                f"patch size, e.g. {_nearest_multiple(image_size, patch_size)}."
            )
        if self.pooling not in POOLING_CHOICES:
            raise ValueError(f"pooling must be one of {POOLING_CHOICES}, got {self.pooling!r}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}.")

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


def _nearest_multiple(image_size: tuple[int, int], patch_size: tuple[int, int]) -> tuple[int, int]:
    return tuple(max(p, round(s / p) * p) for s, p in zip(image_size, patch_size, strict=True))


__all__ = ["VIT_SIZES", "ViTFTConfig", "to_2tuple"]
