"""Configuration of the vit_ft Vision Transformer: its fields, their checks, and the named sizes.

Field names follow transformers' `ViTConfig`, so that checkpoints and users' habits map without translation. How
checkpoints of other formats become this config is loading code (`formats.py`, installed by `loading.py`).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from .sizes import VIT_SIZES

# transformers ViTConfig fields that describe the architecture; a `model_type: vit` config keeps these
VIT_CONFIG_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps",
    "image_size", "patch_size", "num_channels", "qkv_bias",
)  # fmt: skip
# "cls+mean" concatenates both (DINOv2's linear heads); "map" is attention pooling (SigLIP's head), "attn" the
# same without its query projection and MLP (AIMv2's head)
POOLING_CHOICES = ("cls", "mean", "cls+mean", "map", "attn")
# "layernorm" is the ViT's; "rmsnorm" AIMv2's (no mean subtracted, no bias)
NORM_TYPES = ("layernorm", "rmsnorm")
# "gelu" is the paper's MLP (fc1, `hidden_act`, fc2); "swiglu" is DINOv2 giant's gated MLP (timm's SwiGLUPacked)
MLP_TYPES = ("gelu", "swiglu")


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
        pooling: "cls" takes the CLS token (the paper's choice), "mean" averages the patch tokens, "cls+mean"
            concatenates both (DINOv2's linear heads), "map" attends over the tokens with a learned query (SigLIP),
            "attn" too, without query projection and MLP (AIMv2).
        drop_path_rate: stochastic depth, rising linearly from 0 at the first block to this at the last (DeiT).

    The fields after `pooling` (timm's `VisionTransformer` options) default to the plain ViT of the paper:
        layerscale_value: init value of per-channel layer scale on both residual branches (DINOv2), None for none.
        class_token / distillation_token / num_register_tokens: the prefix tokens (DeiT's distillation token,
            DINOv2's registers), in that order before the patch tokens.
        no_embed_class: position embeddings for the patch tokens only (timm's option; SigLIP, DeiT III); otherwise
            the class and distillation tokens have a slot, the registers never do.
        pre_norm: a LayerNorm before the blocks (CLIP); the patch projection then has no bias, as in timm.
        pos_embed_antialias: resample position embeddings with antialiased bicubic (DINOv2 with registers).
        mlp_type: "gelu" (fc1, `hidden_act`, fc2) or "swiglu" (DINOv2 giant: fc2(silu(gate) * value), fc1 packing
            gate and value; `intermediate_size` is then the width of each, `hidden_act` unused by the blocks).
        fc_norm: the final LayerNorm after pooling (`fc_norm`) instead of on every token (MAE's fine-tuning layout
            with pooling "mean", timm's option).
        rope_theta: 2-D rotary position embeddings on the patch tokens with this base (DINOv3) instead of a
            learned table; None for the learned table. Any multiple of the patch runs without resampling.
        rope_shift / rope_jitter / rope_rescale: DINOv3's coordinate augmentations of the rotary positions in
            training mode (its `pos_embed_shift` / `_jitter` / `_rescale`: a uniform shift, a log-uniform stretch per
            axis, one log-uniform scale); None for none. Evaluation and inference never apply them.
        norm_type: "layernorm" or "rmsnorm" (AIMv2) for every norm of the model; `layer_norm_eps` is its eps.
        patch_norm: a norm on the patch embeddings before the positions are added (AIMv2).
        proj_bias / mlp_bias: biases of the attention's output projection and of the MLP (AIMv2 has none).
        max_num_patches: NaFlex (SigLIP 2): images enter at their own aspect ratio as at most this many patches,
            padded and masked (`naflex.py`); None for `image_size` crops. The model takes either input; this says
            which one its data path, evaluation and prediction make.
        head_type: "linear" (the classifier layer) or "knn" (`knn_head.KNNHead`: DINOv2's weighted kNN vote over
            a bank of `knn_bank_size` training features stored in the weights, `knn_k` neighbours, `knn_temperature`)
            or "zeroshot" (`knn_head.ZeroShotHead`: an image-text model's classifier, the pooled feature projected
            to `projection_dim` (CLIP's visual projection; None: SigLIP's, none), L2-normalised, then linear).
        vpt_tokens / vpt_deep: VPT's learned prompt tokens (`prompts.py`) after the prefix tokens, before the
            first block only or (deep) replaced before every block; 0 for none. They count as prefix tokens.
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
    drop_path_rate: float = 0.0
    layerscale_value: float | None = None
    class_token: bool = True
    distillation_token: bool = False
    num_register_tokens: int = 0
    no_embed_class: bool = False
    pre_norm: bool = False
    pos_embed_antialias: bool = False
    mlp_type: str = "gelu"
    fc_norm: bool = False
    rope_theta: float | None = None
    rope_shift: float | None = None
    rope_jitter: float | None = None
    rope_rescale: float | None = None
    norm_type: str = "layernorm"
    patch_norm: bool = False
    proj_bias: bool = True
    mlp_bias: bool = True
    max_num_patches: int | None = None
    head_type: str = "linear"
    knn_bank_size: int = 0
    knn_k: int = 20
    knn_temperature: float = 0.07
    projection_dim: int | None = None
    vpt_tokens: int = 0
    vpt_deep: bool = False

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
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}.")
        if not self.class_token and (self.pooling in ("cls", "cls+mean") or self.distillation_token):
            raise ValueError(
                f"pooling={self.pooling!r} and distillation_token need the class token (class_token=False): "
                "use pooling 'mean' or 'map'."
            )
        if not isinstance(self.num_register_tokens, int) or self.num_register_tokens < 0:
            raise ValueError(f"num_register_tokens must be an int >= 0, got {self.num_register_tokens!r}.")
        if not isinstance(self.vpt_tokens, int) or self.vpt_tokens < 0 or (self.vpt_deep and not self.vpt_tokens):
            raise ValueError(f"vpt_tokens must be an int >= 0 (at least 1 with vpt_deep), got {self.vpt_tokens!r}.")
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_type must be one of {MLP_TYPES}, got {self.mlp_type!r}.")
        if self.norm_type not in NORM_TYPES:
            raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}.")
        if self.head_type not in ("linear", "knn", "zeroshot"):
            raise ValueError(f"head_type must be 'linear', 'knn' or 'zeroshot', got {self.head_type!r}.")
        if self.head_type == "knn" and (self.knn_bank_size < 1 or self.knn_k < 1 or not self.knn_temperature > 0):
            raise ValueError("a kNN head needs knn_bank_size >= 1, knn_k >= 1 and knn_temperature > 0.")
        if self.fc_norm and self.pooling == "cls+mean":
            raise ValueError("fc_norm normalises one pooled token: use pooling 'mean', 'cls' or 'map' with it.")
        if self.rope_theta is not None and (self.hidden_size // self.num_attention_heads) % 4:
            raise ValueError(
                f"rope_theta needs a head width (hidden_size / num_attention_heads = "
                f"{self.hidden_size // self.num_attention_heads}) divisible by 4: pick another head count."
            )
        for name in ("rope_shift", "rope_jitter", "rope_rescale"):
            value = getattr(self, name)
            if value is not None and (self.rope_theta is None or not value >= (0 if name == "rope_shift" else 1)):
                floor = "0" if name == "rope_shift" else "1"
                raise ValueError(f"{name}={value!r} needs rotary positions (rope_theta) and a value of at least {floor}.")
        budget = self.max_num_patches
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0):
            raise ValueError(f"max_num_patches must be a positive int or None (square crops), got {budget!r}.")
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not in transformers' ACT2FN: e.g. 'gelu'.")

    # How checkpoints of other formats (transformers ViT, timm, the ViT paper's JAX .npz) are read as this config:
    # `checkpoint_reader(get_config_dict, name_or_path, **kwargs) -> (config_dict, kwargs)`, installed by
    # vit_ft.model.loading. None in a saved folder's copy of this file, which reads its own config.json as usual.
    checkpoint_reader = None

    @classmethod
    def get_config_dict(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """transformers' config reading, through `checkpoint_reader` where one is installed."""
        if cls.checkpoint_reader is None:
            return super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        return cls.checkpoint_reader(super().get_config_dict, pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any):
        """transformers' `from_dict`; new labels (`num_labels=` or `id2label=`) replace the checkpoint's names,
        `label2id` follows `id2label` when it is not given, and `image_size=None` keeps the checkpoint's size."""
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
        else:  # `image_size=None` keeps the checkpoint's resolution, from a saved vit_ft folder as from a converted one
            kwargs.pop("image_size", None)
        result = super().from_dict(config_dict, **kwargs)
        # transformers sets the keyword overrides after __init__'s checks: pooling="cls" on SigLIP's is checked here
        (result[0] if isinstance(result, tuple) else result)._validate()
        return result

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

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch tokens: class, distillation, register and VPT prompt tokens."""
        return int(self.class_token) + int(self.distillation_token) + self.num_register_tokens + self.vpt_tokens

    @property
    def num_position_prefix(self) -> int:
        """Prefix tokens with a slot in the position-embedding table (class and distillation tokens)."""
        return 0 if self.no_embed_class else int(self.class_token) + int(self.distillation_token)

    @classmethod
    def from_variant(cls, variant: str, **kwargs: Any) -> ViTFTConfig:
        """A config of a named size ("tiny", "small", "base", "large", "huge"); kwargs override fields."""
        if variant not in VIT_SIZES:
            raise ValueError(f"Unknown ViT size {variant!r}; choose one of {sorted(VIT_SIZES)}.")
        return cls(**{**VIT_SIZES[variant], **kwargs})


def nearest_multiple(image_size: tuple[int, int], patch_size: tuple[int, int]) -> tuple[int, int]:
    return tuple(max(p, round(s / p) * p) for s, p in zip(image_size, patch_size, strict=True))


__all__ = [
    "MLP_TYPES",
    "NORM_TYPES",
    "POOLING_CHOICES",
    "VIT_CONFIG_FIELDS",
    "ViTFTConfig",
    "nearest_multiple",
    "to_2tuple",
]
