"""LoRA fine-tuning with peft: apply, and save the adapter and the merged model (loading is `vit_ft.tools.inference`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from ..arguments.fields import ModelArguments, parse_lora_target_modules
from ..kernels import PackedBitsDropout
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.run_record import ADAPTER_DIR

logger = logging.getLogger("vit_ft")

# our module names: the fused query/key/value projection (peft's ViT example adapts query and value);
# "attention+mlp" adds the attention output projection and the MLP
# The family members (DeiT, DINOv2, CLIP, SigLIP) load into the same modules, so the presets hold for all of them;
# "attention+mlp" also adapts SigLIP's attention-pooling head (its proj and MLP), which it fine-tunes
TARGET_PRESETS = {"attention": ["qkv"], "attention+mlp": ["qkv", "proj", "fc1", "fc2"]}
# trained in full besides the head where the model has it: DeiT's second head, on the distillation token
DISTILLATION_HEAD = "distillation_classifier"


def lora_config(model_args: ModelArguments) -> LoraConfig:
    """peft's ViT image-classification defaults (r=16, alpha=16, dropout 0.1), the new head trained in full."""
    targets = parse_lora_target_modules(model_args.lora_target_modules)
    targets = TARGET_PRESETS.get(targets, targets) if isinstance(targets, str) else targets
    return LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=targets,
        modules_to_save=["classifier"],
        bias="none",
    )


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def apply_lora(model: ViTFTForImageClassification, model_args: ModelArguments) -> PeftModel:
    """Wrap `model` with LoRA adapters; logs trainable vs total parameters."""
    config = lora_config(model_args)
    if hasattr(model, DISTILLATION_HEAD):
        config.modules_to_save.append(DISTILLATION_HEAD)
    peft_model = get_peft_model(model, config)
    for module in peft_model.modules():  # peft's per-adapter input dropout, the same rule with fewer draws
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, nn.ModuleDict):
            for name, dropout in dropouts.items():
                if type(dropout) is nn.Dropout:
                    dropouts[name] = PackedBitsDropout(dropout.p)
    trainable, total = count_parameters(peft_model)
    logger.info(
        "LoRA: %s trainable of %s parameters (%.2f%%)",
        f"{trainable:,}",
        f"{total:,}",
        100 * trainable / total,
    )
    return peft_model


def save_lora_outputs(trainer: Any, model_args: ModelArguments, output_dir: Path) -> None:
    """The adapter (with the head) in `output_dir/adapter`, and by default the merged model in `output_dir`."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not trainer.is_world_process_zero():
        return
    adapter_dir = output_dir / ADAPTER_DIR
    model.save_pretrained(adapter_dir)
    model.base_model.model.config.save_pretrained(
        adapter_dir
    )  # the fine-tuned architecture, labels and resolution
    trainer.processing_class.save_pretrained(adapter_dir)
    if model_args.merge_lora:
        merged = merge_lora(model)
        merged.save_pretrained(output_dir)
        trainer.processing_class.save_pretrained(output_dir)


def merge_lora(model: PeftModel) -> ViTFTForImageClassification:
    """A plain ViTFTForImageClassification with the LoRA weights folded in (the adapter model is left intact)."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


__all__ = [
    "apply_lora",
    "count_parameters",
    "lora_config",
    "merge_lora",
    "save_lora_outputs",
]
