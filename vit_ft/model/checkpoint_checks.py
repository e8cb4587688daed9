"""A checkpoint checked before any layer is built (its `config.json` against its weights) and after loading
(whole: no tensor missing, left over or of another shape; `check_complete`, the tools' choice for a trained model,
and `from_pretrained`'s for a vit_ft folder unless `strict=False`).

A config that says 10^5 layers would otherwise build them all (minutes, gigabytes) before the weights show that
there are two. The sizes the weights imply are read from the safetensors header only (no tensor is read), in any
layout vit_ft loads (ours, transformers' ViT, the families': keys read by the names they load as, `weight_mapping`);
then every tensor's shape against the model the config describes, built on the meta device (`check_tensor_shapes`),
so a wrong-shaped tensor is one line naming the file, the tensor and both shapes instead of transformers' table and
traceback. With no readable safetensors weights the sizes are held to sane limits. `formats.checkpoint_info` runs
the check for every vit_ft, transformers ViT and family checkpoint that `from_pretrained` loads, so fine-tunes and
the tools are guarded alike.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from transformers import initialization as init
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

from .configuration_vit_ft import ViTFTConfig, to_2tuple
from .modeling_vit_ft import ViTFTForImageClassification
from .timm_format import read_safetensors_shapes
from .weight_mapping import expected_source_shapes, our_key_names

# Sizes no ViT has (ViT-22B: 48 layers, hidden 6144, MLP 24576; ImageNet-21k: 21,843 labels), held to these
# bounds when no weights say what the sizes are: past them a model is hours of allocation, not a ViT.
SIZE_LIMITS = {
    "num_hidden_layers": 1_000,
    "hidden_size": 65_536,
    "intermediate_size": 262_144,
    "num_attention_heads": 65_536,
    "num_labels": 100_000,
}
# our names (a checkpoint's keys are read by the names they load as)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FC2 = re.compile(r"(?:^|\.)layers\.0\.mlp\.fc2\.weight$")  # (hidden, intermediate), a SwiGLU's too

Shapes = dict[str, tuple[int, ...]]


def sizes_in_weights(shapes: Shapes) -> dict[str, tuple[Any, str]]:
    """field -> (the value the weights imply, the tensor that implies it), for the fields the shapes show; the
    keys in any layout vit_ft loads (a family's are read by the names they load as: `weight_mapping`)."""
    found: dict[str, tuple[Any, str]] = {}
    shapes = {k: v for k, v in shapes.items() if not k.startswith("text_model.")}  # CLIP/SigLIP: vision only
    ours = our_key_names(shapes)
    for key, shape in sorted(shapes.items()):
        name = ours[key]
        if name.endswith("embeddings.cls_token"):
            found["hidden_size"] = (shape[-1], key)
        elif name.endswith("embeddings.patch_embeddings.projection.weight") and len(shape) == 4:
            found["num_channels"] = (shape[1], key)
            found["patch_size"] = ((shape[2], shape[3]), key)
        elif name.endswith("embeddings.position_embeddings") and len(shape) in (2, 3):
            found["positions"] = (shape[-2], key)  # the patch grid and the prefix tokens' slots
        elif _FC2.search(name) and len(shape) == 2:
            found["intermediate_size"] = (shape[1], key)
        elif name == "classifier.weight":
            found["num_labels"] = (shape[0], key)
    layers = {int(match.group(1)): key for key in shapes if (match := _LAYER.search(ours[key]))}
    if layers:
        last = max(layers)
        found["num_hidden_layers"] = (last + 1, layers[last])
    return found


def _configured(config_dict: dict[str, Any], field: str) -> Any:
    """The config's value of `field` in the form `sizes_in_weights` gives it."""
    if field == "num_labels":
        id2label = config_dict.get("id2label")
        return len(id2label) if isinstance(id2label, dict) else config_dict.get("num_labels")
    if field == "positions":
        (h, w), (ph, pw) = (_configured(config_dict, name) for name in ("image_size", "patch_size"))
        fields = {
            k: v
            for k, v in config_dict.items()
            # pooling too: a folder without class token pools by mean or map, which the config checks
            if k in ("class_token", "distillation_token", "no_embed_class", "pooling")
        }
        return (h // ph) * (w // pw) + ViTFTConfig(**fields).num_position_prefix
    value = config_dict.get(field, getattr(ViTFTConfig, field, None))  # a field left out has its default
    return to_2tuple(value, field) if field in ("image_size", "patch_size") else value


def check_sizes(
    config_dict: dict[str, Any],
    shapes: Shapes | None,
    config_name: str,
    weights_name: str | None,
    skip: tuple[str, ...] = (),
) -> None:
    """Raise a ValueError naming `config_name` and the field when the config's sizes disagree with `shapes` (the
    weights' header, `weights_name`), or, with no weights to compare with, exceed `SIZE_LIMITS`. `skip`: fields
    the config may change (a LoRA fine-tune's labels and resolution against its base model's weights)."""
    for field in ("hidden_size", "num_attention_heads"):
        value = _configured(config_dict, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{config_name}: {field} must be a positive int, got {value!r}; {_FIX}")
    hidden, heads = _configured(config_dict, "hidden_size"), _configured(config_dict, "num_attention_heads")
    if hidden % heads:
        raise ValueError(
            f"{config_name}: num_attention_heads={heads} does not divide hidden_size={hidden}; {_FIX}"
        )
    if shapes is None:
        for field, limit in SIZE_LIMITS.items():
            value = _configured(config_dict, field)
            if isinstance(value, int) and value > limit:
                raise ValueError(
                    f"{config_name}: {field}={value} is above {limit:,}, more than any ViT has, and there are no "
                    f"safetensors weights to say otherwise; {_FIX}"
                )
        return
    for field, (value, tensor) in sizes_in_weights(shapes).items():
        configured = _configured(config_dict, field)
        # a config without labels loads a classifier checkpoint as a backbone (its head discarded, and said so)
        if configured in (None, value) or field in skip or (field == "num_labels" and configured == 0):
            continue
        if field == "num_hidden_layers":
            held = f"{value} layers (the last: {tensor})"
        else:
            held = f"{value} ({tensor} {list(shapes[tensor])})"
        raise ValueError(
            f"{config_name}: {_DESCRIBED.get(field, field)} is {configured}, but {weights_name} holds {held}: the "
            f"config does not describe these weights; {_FIX}"
        )
    check_tensor_shapes(config_dict, shapes, weights_name, skip)


def model_shapes(config_dict: dict[str, Any]) -> tuple[Shapes, str]:
    """(key -> shape of every tensor, the base-model prefix) of the classifier `config_dict` describes, built on
    the meta device (no memory, milliseconds): the shapes its `from_pretrained` loads the weights into."""
    config = ViTFTConfig(**{k: v for k, v in config_dict.items() if k != "model_type"})
    with torch.device("meta"), init.no_init_weights():
        model = ViTFTForImageClassification(config)
    return {key: tuple(t.shape) for key, t in model.state_dict().items()}, model.base_model_prefix


def check_tensor_shapes(
    config_dict: dict[str, Any], shapes: Shapes, weights_name: str | None, skip: tuple[str, ...] = ()
) -> None:
    """`check_complete`'s error for the tensors of the weights (`shapes`, the header, in any layout vit_ft loads)
    whose shape is not the one the model `config_dict` describes needs, before any layer is built: the one check
    for our folders, transformers' ViT and the families, whose keys are read as they load
    (`weight_mapping.expected_source_shapes`). `skip` as for `check_sizes` (`num_labels`: the head unchecked)."""
    expected_shapes, prefix = model_shapes(config_dict)
    heads = ("classifier.", "distillation_classifier.")
    mismatched = [
        (key, shapes[key], shape)
        for key, (ours, shape) in expected_source_shapes(shapes, expected_shapes, prefix).items()
        if tuple(shapes[key]) != shape and not ("num_labels" in skip and ours.startswith(heads))
    ]
    check_complete({"missing_keys": (), "unexpected_keys": (), "mismatched_keys": mismatched}, str(weights_name))


_DESCRIBED = {
    "num_labels": "num_labels (entries in id2label)",
    "positions": "image_size / patch_size (patch positions)",
}
_FIX = "restore the config.json the model was saved with, or save the model again."


def weight_shapes(name_or_path: str | os.PathLike, **download: Any) -> tuple[str, Shapes] | None:
    """(the weights' name, key -> shape) from the safetensors header(s) of a folder or Hub id (a sharded
    checkpoint's shards together); None when there are no safetensors weights, or they cannot be read (the
    loader then says which file is truncated)."""
    for filename in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME):
        try:
            path = cached_file(
                str(name_or_path), filename, _raise_exceptions_for_missing_entries=False, **download
            )
            if path is None:
                continue
            if filename == SAFE_WEIGHTS_NAME:
                return f"{name_or_path}/{filename}", read_safetensors_shapes(path)
            shards = sorted(set(json.loads(Path(path).read_text(encoding="utf-8"))["weight_map"].values()))
            shapes: Shapes = {}
            for shard in shards:
                shapes.update(read_safetensors_shapes(cached_file(str(name_or_path), shard, **download)))
            return f"{name_or_path}/{filename}", shapes
        except Exception:  # noqa: BLE001 - unreadable or unreachable: the loader reports it, naming the file
            return None
    return None


def check_config_fits_weights(
    config_dict: dict[str, Any], name_or_path: str | os.PathLike, **download: Any
) -> str | None:
    """`check_sizes` of the checkpoint at `name_or_path` (a folder or Hub id) against its own weights; returns
    the weights' name (None when there are no readable safetensors weights)."""
    found = weight_shapes(name_or_path, **download)
    weights_name, shapes = found if found is not None else (None, None)
    check_sizes(config_dict, shapes, f"{name_or_path}/config.json", weights_name)
    return weights_name


def check_complete(info: dict[str, Any], weights: str, allowed: tuple[str, ...] = (), fix: str = "") -> None:
    """Raise a ValueError naming `weights` and the tensors when transformers' loading `info` lists a tensor the
    model needs and the file lacks, one the model has no place for, or one of another shape (the `allowed`
    missing keys, e.g. a head, excepted): a trained model is never run with randomly initialised parts. `fix`:
    what else the caller may do, after saving the model again."""
    missing = sorted(k for k in info["missing_keys"] if k.removeprefix("vit.") not in allowed)
    problems = {
        "lacks tensors the model needs": missing,
        "has tensors the model has no place for": sorted(info["unexpected_keys"]),
        "has tensors of another shape than the model's": [
            f"{key} {list(saved)} (model: {list(expected)})"
            for key, saved, expected in sorted(info["mismatched_keys"])
        ],
    }
    for what, keys in problems.items():
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise ValueError(
                f"{weights} {what}: {', '.join(keys[:3])}{more}; a trained model loads whole or not at all. "
                f"Copy or save the model again (its config.json and weights together){f', {fix}' if fix else ''}."
            )


# the model's weight files, in the order transformers looks for them; a folder's other .safetensors (a feature
# bank, an EMA copy) are not the model's
WEIGHT_FILE_PATTERNS = (
    SAFE_WEIGHTS_NAME, "model-*-of-*.safetensors", "adapter_model.safetensors", "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
)  # fmt: skip


def weights_file_name(name: str | os.PathLike) -> str:
    """The model's weight file in a folder (its first one), or of a Hub id, as the user would look for it."""
    folder = Path(name)
    if folder.is_dir():
        for pattern in WEIGHT_FILE_PATTERNS:
            if files := sorted(folder.glob(pattern)):
                return str(files[0])
    return f"{name}/{SAFE_WEIGHTS_NAME}"


__all__ = [
    "SIZE_LIMITS",
    "check_complete",
    "check_config_fits_weights",
    "check_sizes",
    "check_tensor_shapes",
    "model_shapes",
    "sizes_in_weights",
    "weight_shapes",
]
