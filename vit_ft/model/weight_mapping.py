"""transformers ViT and timm checkpoints -> our modules, as transformers weight transforms.

transformers applies these to every checkpoint key (renamings first, then at most one converter) before it loads
the tensors into the model: so dtype, device_map, meta-device init, sharded and Hub checkpoints and the loading info
are transformers' own. The rename tables are `conversion.py`'s and `timm_format.py`'s; query/key/value are fused
into our qkv, the position embeddings resampled to the model's grid, the head kept only for its own labels. They
only ever load: on save our keys are written as they are. `loading.py` registers them for model_type "vit_ft".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import NoReturn

import torch
from transformers.core_model_loading import (
    ConversionOps,
    WeightConverter,
    WeightRenaming,
    apply_renamings,
    rename_source_key,
)

from .conversion import HEAD_KEYS, LAYER_RENAMES, QKV_SOURCES
from .families import (
    AIMV2_HEAD_KV,
    CLIP_CLASS_EMBEDDING,
    FAMILY_PREFIXES,
    FAMILY_QKV_SOURCES,
    FAMILY_RENAMES,
    SIGLIP_IN_PROJ,
)
from .loading_report import active_load
from .pos_embed import resample_position_embeddings
from .timm_format import TIMM_BLOCK_KEYS, TIMM_KEYS, TIMM_LAYER_SCALE


class _LoadOnly:
    """A weight transform that transformers does not reverse on save_pretrained: our folders keep our keys,
    which Trainer's checkpoint resume reads back with a plain load_state_dict."""

    def reverse_transform(self):
        # the identity on the first target only: transformers renames every match to the first target, so a
        # one-to-many split (SigLIP's in-projection -> q, kv) would otherwise write kv under q's name
        target = self._original_target_patterns[0]
        # a target with a backreference (timm's block index) matches its own output through a capturing group
        return WeightRenaming(target.replace(r"\1", r"(\d+)"), target)


class _Renaming(_LoadOnly, WeightRenaming):
    pass


class _Converter(_LoadOnly, WeightConverter):
    pass


def _refuse(message: str) -> NoReturn:
    """Stop loading this tensor with an error the loading report raises as it is (transformers would only list it
    in its table and raise a general one)."""
    active_load().errors.append(message)
    raise ValueError(message)


Shape = tuple[int, ...]


class FuseQKV(ConversionOps):
    """Concatenate a layer's query, key and value projections, in that order, into our qkv `(3 * hidden, ...)`."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        """Each projection: a third of our qkv."""
        return (targets[0][0] // 3, *targets[0][1:])

    @torch.no_grad()
    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        missing = [
            part
            for part, source in zip(("query", "key", "value"), source_patterns, strict=True)
            if source not in input_dict
        ]
        if missing == ["key"] and kwargs["full_layer_name"].endswith("bias"):
            # DINOv3 has no key bias: zeros are exact, as a key bias adds the same to every logit of a query's row
            input_dict[source_patterns[1]] = [torch.zeros_like(input_dict[source_patterns[0]][0])]
            missing = []
            active_load().mapped["no key bias -> attention.qkv"] = "zeros (exact: softmax ignores a key bias)"
        if missing:
            _refuse(
                f"the checkpoint has an incomplete attention projection for {kwargs['full_layer_name']}: missing "
                f"{missing}; load a complete transformers ViT checkpoint."
            )
        parts = [tensor for source in source_patterns for tensor in input_dict.pop(source)]
        return {target_patterns[0]: torch.cat(parts, dim=0)}


class PackGatedMLP(ConversionOps):
    """DINOv3's and AIMv2's MLP: a gated one's `gate_proj` and `up_proj` -> our packed fc1 `(2 * width, ...)`, gate
    first (our SwiGLU); a plain one's `up_proj` alone is our fc1 as it is. AIMv2's pooling head packs its key and
    value projections into our `attn_pool.kv` the same way."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        """Half our fc1 (gated, the two packed) or all of it (plain)."""
        half = (targets[0][0] // 2, *targets[0][1:])
        return tuple(shape) if tuple(shape) == tuple(targets[0]) else half

    @torch.no_grad()
    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        present = [source for source in source_patterns if source in input_dict]
        parts = [tensor for source in present for tensor in input_dict.pop(source)]
        if len(present) > 1:
            how = "packed, gate first (our SwiGLU)" if "gate" in present[0] else "packed, key then value"
            active_load().mapped[f"{' + '.join(present)} -> {target_patterns[0]}"] = how
        return {target_patterns[0]: torch.cat(parts, dim=0)}


class ResamplePositionEmbeddings(ConversionOps):
    """Resample the checkpoint's position-embedding table to the model's patch grid (`pos_embed.py`)."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        """Any number of positions (resampled; `checkpoint_checks` compares it with the config's grid), our width,
        in our `(1, positions, hidden)` or CLIP's and SigLIP's `(positions, hidden)`."""
        positions = shape[-2] if len(shape) >= 2 else 0
        return (positions, targets[0][-1]) if len(shape) == 2 else (1, positions, targets[0][-1])

    def convert(self, input_dict, source_patterns, target_patterns, model=None, config=None, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        tensor = tensor[None] if tensor.dim() == 2 else tensor  # CLIP / SigLIP keep (positions, hidden)
        target, prefix = config.grid_size, config.num_position_prefix
        load = active_load()
        source = load.info.grid if load.info else target
        if (
            tensor.shape[1] != prefix + source[0] * source[1]
        ):  # another source: only a square grid is inferred
            side = math.isqrt(tensor.shape[1] - prefix)
            if side * side != tensor.shape[1] - prefix:
                _refuse(
                    f"cannot tell the patch grid of position embeddings {tuple(tensor.shape)}: load from the "
                    "checkpoint's folder with image_size=... instead of passing config= or state_dict="
                )
            source = (side, side)
        if source != target:
            tensor = resample_position_embeddings(tensor, source, target, prefix, config.pos_embed_antialias)
            load.resampled["embeddings.position_embeddings"] = (source, target)
        return {target_patterns[0]: tensor}


class ReshapeClassToken(ConversionOps):
    """CLIP's class embedding `(hidden,)` -> our class token `(1, 1, hidden)`."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        return (targets[0][-1],)

    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        return {target_patterns[0]: tensor.reshape(1, 1, -1)}


class SplitInProjection(ConversionOps):
    """SigLIP's pooling head: `nn.MultiheadAttention`'s in-projection `(3 * hidden, ...)` -> our query
    `(hidden, ...)` and fused key/value `(2 * hidden, ...)` (timm's `AttentionPoolLatent` layout)."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        return (sum(target[0] for target in targets), *targets[0][1:])

    @torch.no_grad()
    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        hidden = tensor.shape[0] // 3
        return {
            target_patterns[0]: tensor[:hidden].contiguous(),
            target_patterns[1]: tensor[hidden:].contiguous(),
        }


class PatchLinearToConv(ConversionOps):
    """SigLIP 2's patch projection, a linear map over patchified pixels `(hidden, patch_h * patch_w * channels)`
    in its processor's layout (rows, columns, channels) -> our convolution `(hidden, channels, patch_h, patch_w)`;
    every other checkpoint's convolution passes unchanged."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        hidden, channels, patch_h, patch_w = targets[0]
        return (hidden, patch_h * patch_w * channels) if len(shape) == 2 else targets[0]

    def convert(self, input_dict, source_patterns, target_patterns, model=None, config=None, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        if tensor.dim() == 2:
            (patch_h, patch_w), channels = config.patch_hw, config.num_channels
            tensor = tensor.reshape(-1, patch_h, patch_w, channels).permute(0, 3, 1, 2).contiguous()
            active_load().mapped["embeddings.patch_embedding (linear) -> patch convolution"] = (
                "reshaped (rows, columns, channels) -> (channels, rows, columns): the same map (NaFlex)"
            )
        return {target_patterns[0]: tensor}


class KeepHeadForSameLabels(ConversionOps):
    """Keep a classifier only for the checkpoint's own labels; otherwise drop it, so that transformers
    initialises a new one (zero, as in the paper) and lists it as missing."""

    def source_shape(self, shape: Shape, targets: list[Shape]) -> Shape:
        """The head of the checkpoint's own config (another one is replaced only for other labels)."""
        return targets[0]

    def convert(self, input_dict, source_patterns, target_patterns, model=None, config=None, **kwargs):
        (tensor,) = input_dict.pop(source_patterns[0])
        name = kwargs["full_layer_name"]
        load = active_load()
        same_labels = load.info is None or load.info.id2label == config.id2label
        if same_labels and tensor.shape == model.get_parameter(name).shape:
            return {target_patterns[0]: tensor}
        load.replaced[name.removeprefix("vit.")] = tuple(tensor.shape)
        return {}


def checkpoint_conversion_mapping() -> list[WeightRenaming | WeightConverter]:
    """transformers ViT checkpoints (ViTModel, ViTForImageClassification) and timm ViTs -> our modules, as
    transformers weight transforms: `conversion.py`'s tables and timm's, the position embeddings resampled, the
    head kept for its own labels. Our own folders have our keys already and pass through unchanged."""
    # the family's base-model prefixes first (anchored), then its module names (families.py)
    mapping: list[WeightRenaming | WeightConverter] = [
        _Renaming(rf"^{re.escape(source)}", target) for source, target in FAMILY_PREFIXES.items()
    ]
    mapping += [_Renaming(re.escape(source), target) for source, target in FAMILY_RENAMES.items()]
    mapping.append(_Renaming(r"encoder\.layer\.", "layers."))
    mapping += [
        _Renaming(rf"\.{re.escape(source)}\.", f".{target}.") for source, target in LAYER_RENAMES.items()
    ]
    # timm ViTs (timm_format.TIMM_KEYS): anchored at the key's start, so they never touch our own keys
    mapping += [_Renaming(rf"^{re.escape(source)}$", target) for source, target in TIMM_KEYS.items()]
    mapping += [
        _Renaming(rf"^blocks\.(\d+)\.{re.escape(source)}$", rf"layers.\1.{target}")
        for source, target in TIMM_LAYER_SCALE.items()
    ]
    mapping += [
        _Renaming(rf"^blocks\.(\d+)\.{re.escape(source)}\.", rf"layers.\1.{target}.")
        for source, target in TIMM_BLOCK_KEYS.items()
    ]
    qkv_sources = (*QKV_SOURCES, *FAMILY_QKV_SOURCES)
    mapping += [_Converter(list(names), "attention.qkv", [FuseQKV()]) for names in qkv_sources]
    mapping.append(_Converter(["mlp.gate_proj", "mlp.up_proj"], "mlp.fc1", [PackGatedMLP()]))
    mapping.append(_Converter(list(AIMV2_HEAD_KV), "attn_pool.kv", [PackGatedMLP()]))  # key then value
    mapping.append(_Converter(CLIP_CLASS_EMBEDDING, "embeddings.cls_token", [ReshapeClassToken()]))
    for kind in ("weight", "bias"):
        targets = [f"attn_pool.q.{kind}", f"attn_pool.kv.{kind}"]
        mapping.append(_Converter(f"{SIGLIP_IN_PROJ}{kind}", targets, [SplitInProjection()]))
    mapping.append(
        _Converter(
            "embeddings.position_embeddings", "embeddings.position_embeddings", [ResamplePositionEmbeddings()]
        )
    )
    patch = "embeddings.patch_embeddings.projection.weight"
    mapping.append(_Converter(patch, patch, [PatchLinearToConv()]))
    heads = (*HEAD_KEYS, "distillation_classifier.weight", "distillation_classifier.bias")
    mapping += [_Converter(key, key, [KeepHeadForSameLabels()]) for key in heads]
    return mapping


def _renamed(keys: Iterable[str]) -> Iterator[tuple[str, str, WeightConverter | None]]:
    """(checkpoint key, its name after the renamings and at most one converter, that converter) for each key, as
    transformers renames them when loading (`checkpoint_conversion_mapping`)."""
    mapping = checkpoint_conversion_mapping()
    renamings = [t for t in mapping if not isinstance(t, WeightConverter)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    for key in keys:
        renamed = apply_renamings(key, renamings)
        # at most one converter applies: the first that matches, as in transformers' `apply_converters`
        found = ((c, *c.rename_source_key(renamed)) for c in converters)
        converter, target, _ = next(((c, t, p) for c, t, p in found if p is not None), (None, renamed, None))
        yield key, target, converter


def our_key_names(keys: Iterable[str]) -> dict[str, str]:
    """checkpoint key -> the key it loads as in our modules (a family's base-model prefix becomes `vit.`)."""
    return {key: ours for key, ours, _ in _renamed(keys)}


def expected_source_shapes(
    shapes: dict[str, Shape], model_shapes: dict[str, Shape], base_model_prefix: str
) -> dict[str, tuple[str, Shape]]:
    """checkpoint key -> (our key, the shape it must have), for each tensor of a checkpoint (`shapes`, its
    safetensors header) that loads into a tensor of a model (`model_shapes`, its state dict's): renamed and
    converted as transformers does when loading, so the families' and timm's names are checked as our own. A
    tensor the model has no place for (a discard) is left out."""
    expected = {}
    for key, renamed, converter in _renamed(shapes):
        ours, _ = rename_source_key(renamed, [], [], base_model_prefix, model_shapes)  # the base prefix only
        if ours not in model_shapes:
            continue
        if converter is None:
            expected[key] = (ours, model_shapes[ours])
            continue
        first, *others = converter.target_patterns  # a one-to-many converter: every target's shape
        targets = [model_shapes[ours]] + [model_shapes.get(ours.removesuffix(first) + t, ()) for t in others]
        expected[key] = (ours, tuple(converter.operations[0].source_shape(tuple(shapes[key]), targets)))
    return expected


__all__ = ["checkpoint_conversion_mapping", "expected_source_shapes", "our_key_names"]
