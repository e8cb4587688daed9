"""peft adapters (LoRA and the other methods of `training.peft_methods`): apply, and save the adapter and the
merged model (loading is `vit_ft.tools.trained`). The names say LoRA, the first of them; each function serves every
method of the table alike."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model
from torch import nn
from transformers import TrainerCallback

from ..arguments.fields import ModelArguments
from ..kernels import PackedBitsDropout
from ..model.adapters import merge_adapter
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.run_record import ADAPTER_DIR
from .peft_methods import PEFT_METHOD_TABLE, peft_config

logger = logging.getLogger("vit_ft")
# AdaLoRA's budget schedule as fractions of the run's optimizer steps: the first 10 % at init_r, the ranks pruned
# to target_r until 70 %, then fixed (the paper's warm-up / final phases, scaled to our runs)
ADALORA_TINIT, ADALORA_TFINAL = 0.1, 0.3


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def apply_lora(model: ViTFTForImageClassification, model_args: ModelArguments) -> PeftModel:
    """Wrap `model` with the adapters of `model_args.method` (any peft method of the table); logs trainable vs
    total parameters."""
    peft_model = get_peft_model(model, peft_config(model_args, model))
    for module in peft_model.modules():  # peft's per-adapter input dropout, the same rule with fewer draws
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, nn.ModuleDict):
            for name, dropout in dropouts.items():
                if type(dropout) is nn.Dropout:
                    dropouts[name] = PackedBitsDropout(dropout.p)
    trainable, total = count_parameters(peft_model)
    logger.info(
        "%s: %s trainable of %s parameters (%.2f%%)",
        model_args.method if model_args.method != "lora" else "LoRA",
        f"{trainable:,}",
        f"{total:,}",
        100 * trainable / total,
    )
    return peft_model


class AdaLoraCallback(TrainerCallback):
    """AdaLoRA's rank budget: its schedule set from the run's steps when training starts, and the ranks
    reallocated after each optimizer step (before the gradients are cleared, which the allocation reads)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        config = model.peft_config["default"]
        config.total_step = max(state.max_steps, 3)
        config.tinit = int(ADALORA_TINIT * config.total_step)
        config.tfinal = int(ADALORA_TFINAL * config.total_step)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        model.base_model.update_and_allocate(state.global_step)


def peft_callbacks(model: Any, training_args: Any, resume: str | None) -> list[TrainerCallback]:
    """The callbacks a method needs during training (AdaLoRA's rank allocation), none for the others. AdaLoRA
    cannot go back to a checkpoint: its pruned ranks change the adapter's shapes (peft then cannot load it into the
    running model) and its importance scores are not saved, so a resume or the best checkpoint is one line."""
    config = getattr(model, "peft_config", {}).get("default")
    if type(config).__name__ != "AdaLoraConfig":
        return []
    if resume or training_args.load_best_model_at_end:
        raise ValueError(
            f"method adalora cannot {'--resume' if resume else 'load_best_model_at_end'}: its pruned ranks and "
            "importance scores are not in Trainer's checkpoints; "
            + ("start without --resume" if resume else "set load_best_model_at_end false")
            + ", or use lora / dora."
        )
    return [AdaLoraCallback()]


def save_lora_outputs(trainer: Any, model_args: ModelArguments, output_dir: Path) -> None:
    """The adapter (with the head) in `output_dir/adapter`, and by default the merged model in `output_dir`
    (a method that cannot merge says so in one line and leaves the adapter alone)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not trainer.is_world_process_zero():
        return
    adapter_dir = output_dir / ADAPTER_DIR
    model.save_pretrained(adapter_dir)
    model.base_model.model.config.save_pretrained(
        adapter_dir
    )  # the fine-tuned architecture, labels and resolution
    trainer.processing_class.save_pretrained(adapter_dir)
    if model_args.merge_lora and not PEFT_METHOD_TABLE[model_args.method].mergeable:
        logger.info("%s cannot be merged into the weights: the output is the adapter alone (adapter/).",
                    model_args.method)  # fmt: skip
    elif model_args.merge_lora:
        merged = merge_lora(model)
        merged.save_pretrained(output_dir)
        trainer.processing_class.save_pretrained(output_dir)


def merge_lora(model: PeftModel) -> ViTFTForImageClassification:
    """A plain ViTFTForImageClassification with the adapter folded in (the adapter model is left intact)."""
    return merge_adapter(copy.deepcopy(model))


__all__ = [
    "AdaLoraCallback",
    "apply_lora",
    "count_parameters",
    "merge_lora",
    "peft_callbacks",
    "save_lora_outputs",
]
