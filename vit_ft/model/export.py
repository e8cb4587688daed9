"""Export a vit_ft model to the transformers class it is exactly (ViT, or the family's own class: DeiT, DINOv2,
SigLIP; no remote code needed to load it; `family_export.py` says which) or to timm's Hub layout."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import ViTConfig, ViTImageProcessorPil

from ..utils.files import staged_folder
from .configuration_vit_ft import VIT_CONFIG_FIELDS, ViTFTConfig
from .conversion import to_hf_vit_state_dict
from .family_export import (
    SIGLIP2_CLASS,
    VIT_CLASS,
    family_config,
    head_fields,
    to_family_state_dict,
    transformers_class_for,
    transformers_export_reason,
)
from .modeling_vit_ft import ViTFTForImageClassification, ViTFTModel
from .naflex import naflex_budget
from .timm_format import TIMM_LAYER_NORM_EPS, timm_config_dict, to_timm_state_dict

logger = logging.getLogger(__name__)
# what an image processor's settings say of the pixels, beyond the geometry (which an export sets)
NORMALISATION_KEYS = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "resample")


def export_to_transformers(
    model: ViTFTForImageClassification,
    output_dir: str | Path,
    image_processor: ViTImageProcessorPil | None = None,
    with_head: bool = True,
) -> Path:
    """Write `model` as a folder of the transformers class it is exactly (`transformers_class_for`: a plain ViT as
    `ViTForImageClassification`, DeiT with its distillation token as `DeiTForImageClassificationWithTeacher`,
    DINOv2 with pooling "cls+mean" as `Dinov2[WithRegisters]ForImageClassification`, SigLIP with pooling "mean" as
    `SiglipForImageClassification`), with a `ViTImageProcessor`; a model no class expresses is a ValueError saying
    why (share it in the vit_ft format).

    The position embeddings stay at the model's (fine-tuned) resolution and the config's `image_size` says
    so; the processor resizes to that size. `with_head=False` writes a plain ViT's backbone as a `ViTModel`
    checkpoint (no classifier, no label names), the layout of google/vit-base-patch16-224-in21k. The folder is
    written to a temporary sibling and renamed into place, so a failed export never leaves a half-written folder.
    """
    config = model.config
    target = _export_target(config, with_head)
    image_processor = _export_processor(config, target, image_processor)
    state_dict = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if target not in (None, VIT_CLASS):
        return _write_family(Path(output_dir), config, target, image_processor, state_dict)
    state_dict = to_hf_vit_state_dict(state_dict, config.num_hidden_layers)
    if not with_head:  # ViTModel keys carry no `vit.` prefix
        state_dict = {
            k.removeprefix("vit."): v for k, v in state_dict.items() if not k.startswith("classifier.")
        }
    return _write_atomically(Path(output_dir), _vit_config(config, with_head), image_processor, state_dict)


def _export_target(config: ViTFTConfig, with_head: bool) -> str | None:
    """The transformers class a classifier exports to (None: the `ViTModel` backbone, `with_head=False`), or a
    ValueError saying why the model cannot be one (share it in the vit_ft format)."""
    if with_head and config.num_labels < 1:
        raise ValueError(
            "The model has no classification head (num_labels=0); nothing to export as a classifier."
        )
    target = transformers_class_for(config) if with_head else None
    if with_head and target is None:
        raise ValueError(
            f"{transformers_export_reason(config)}: share it in the vit_ft format (save_pretrained: loads with "
            "trust_remote_code=True) instead."
        )
    if not with_head and config.pooling != "cls":
        raise ValueError(
            f"transformers' ViTForImageClassification classifies the CLS token; this model uses pooling="
            f"{config.pooling!r}, which it cannot express. Share it in the vit_ft format instead."
        )
    if not with_head and family_features(config):
        raise ValueError(
            f"transformers' ViTModel cannot express this model's {', '.join(family_features(config))}; share it "
            "in the vit_ft format (save_pretrained: loads with trust_remote_code=True) instead."
        )
    return target


def _export_processor(
    config: ViTFTConfig, target: str | None, image_processor: ViTImageProcessorPil | None
) -> Any:
    """`image_processor` (ViT's default if None) resizing to the model's resolution, or for a NaFlex model
    (`SIGLIP2_CLASS`) Siglip2's with the same normalisation and the model's patch budget."""
    height, width = config.image_hw
    image_processor = ViTImageProcessorPil(
        **{
            **(image_processor or ViTImageProcessorPil()).to_dict(),
            "size": {"height": height, "width": width},
        }
    )
    if target == SIGLIP2_CLASS:  # NaFlex: the processor patchifies each image at its aspect ratio, in the budget
        from transformers import Siglip2ImageProcessorPil

        settings = image_processor.to_dict()
        return Siglip2ImageProcessorPil(
            **{key: settings[key] for key in NORMALISATION_KEYS}, **naflex_budget(config)
        )
    return image_processor


def export_to_timm(
    model: ViTFTForImageClassification | ViTFTModel,
    output_dir: str | Path,
    image_mean: list[float] | None = None,
    image_std: list[float] | None = None,
) -> Path:
    """Write `model` in timm's Hub layout: `config.json` (`architecture`, `model_args` stating every size,
    `pretrained_cfg` with mean/std) and `model.safetensors` with timm's keys (`timm_format.TIMM_KEYS`).

    `timm.create_model("hf-hub:...")` builds the same ViT from it (mean pooling becomes global_pool='avg'
    with fc_norm=False), and `from_pretrained` reads it back. timm's LayerNorms use eps 1e-6: a model with
    another eps (1e-12, from transformers' checkpoints) records it for vit_ft, and gives outputs within
    about 1e-5 under timm. Written to a temporary sibling and renamed into place.
    """
    config = model.config
    if family_features(config):
        raise ValueError(
            f"vit_ft writes timm's layout for the plain ViT only; this model has {', '.join(family_features(config))}: "
            "share it in the vit_ft format (save_pretrained) instead."
        )
    mean = list(image_mean) if image_mean is not None else [0.5] * config.num_channels
    std = list(image_std) if image_std is not None else [0.5] * config.num_channels
    timm_config = timm_config_dict(config, mean, std)
    state_dict = to_timm_state_dict(
        {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}, config
    )
    if config.layer_norm_eps != TIMM_LAYER_NORM_EPS:
        logger.warning(
            "timm's ViT uses LayerNorm eps %s; this model uses %s (kept for vit_ft in config.json).",
            TIMM_LAYER_NORM_EPS,
            config.layer_norm_eps,
        )
    with staged_folder(output_dir) as staging:
        (staging / "config.json").write_text(json.dumps(timm_config, indent=2) + "\n", encoding="utf-8")
        save_file(state_dict, staging / "model.safetensors", metadata={"format": "pt"})
    return Path(output_dir)


def family_features(config: ViTFTConfig) -> list[str]:
    """What `config` has beyond the plain ViT (the options of DeiT, DINOv2/v3, CLIP, SigLIP, MAE, AIMv2), named."""
    plain = ViTFTConfig()
    names = {
        "layerscale_value": "layer scale",
        "class_token": "class token setting",
        "distillation_token": "distillation token",
        "num_register_tokens": "register tokens",
        "no_embed_class": "position embeddings without class slot",
        "pre_norm": "norm before the blocks",
        "pos_embed_antialias": "antialiased position resampling",
        "mlp_type": "SwiGLU MLP",
        "fc_norm": "norm after the pooling (fc_norm)",
        "rope_theta": "rotary position embeddings",
        "norm_type": "RMSNorm",
        "patch_norm": "norm on the patch embeddings",
        "proj_bias": "attention output without bias",
        "mlp_bias": "MLP without bias",
    }
    return [what for name, what in names.items() if getattr(config, name) != getattr(plain, name)]


def _vit_config(config: ViTFTConfig, with_head: bool) -> ViTConfig:
    """transformers' ViTConfig of the same architecture at the model's resolution (labels only with a head)."""
    height, width = config.image_hw
    fields = {name: getattr(config, name) for name in VIT_CONFIG_FIELDS if name != "image_size"}
    head = head_fields(config)  # labels, problem_type and a multi-label model's decision threshold
    return ViTConfig(
        **fields,
        image_size=height if height == width else [height, width],
        **(head if with_head else {}),
        architectures=["ViTForImageClassification" if with_head else "ViTModel"],
    )


def _write_family(
    output_dir: Path,
    config: ViTFTConfig,
    target: str,
    processor: ViTImageProcessorPil,
    state_dict: dict[str, torch.Tensor],
) -> Path:
    """The model as transformers' `target` class, its weights loaded strictly (every parameter ours, nothing left
    over) and saved by that class itself, in its on-disk names; written to a temporary sibling, then renamed."""
    import transformers

    family_config_ = family_config(config, target)
    with torch.device("meta"):  # no random init: every parameter is replaced by ours below
        family_model = getattr(transformers, target)(family_config_)
    shapes = {key: tensor.shape for key, tensor in family_model.state_dict().items()}
    family_model.load_state_dict(to_family_state_dict(state_dict, target, shapes), strict=True, assign=True)
    with staged_folder(output_dir) as staging:
        family_model.save_pretrained(staging)
        processor.save_pretrained(staging)
    return output_dir


def _write_atomically(
    output_dir: Path, config: ViTConfig, processor: ViTImageProcessorPil, state_dict: dict[str, torch.Tensor]
) -> Path:
    """Config, processor and weights written to a temporary sibling folder, then renamed into place."""
    with staged_folder(output_dir) as staging:
        config.save_pretrained(staging)
        processor.save_pretrained(staging)
        save_file(state_dict, staging / "model.safetensors", metadata={"format": "pt"})
    return output_dir


__all__ = [
    "NORMALISATION_KEYS",
    "export_to_timm",
    "export_to_transformers",
    "transformers_class_for",
    "transformers_export_reason",
]
