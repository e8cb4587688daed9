"""The model a fine-tune starts from: the pre-trained ViT at the fine-tuning resolution with a new head for the
task (checked complete), the CPU kernels where they apply, LoRA where asked, and its image processor."""

from __future__ import annotations

import logging
from typing import Any

from transformers import ViTImageProcessorPil
from transformers.image_utils import PILImageResampling

from ..arguments.fields import ModelArguments
from ..kernels import kernelize
from ..model.formats import checkpoint_normalization
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..tasks import Task, task_for
from .faults import check_base_checkpoint

logger = logging.getLogger("vit_ft")


def build_model(
    model_args: ModelArguments, names: list[str], task: Task | None = None
) -> tuple[Any, ViTImageProcessorPil]:
    """The model to fine-tune: the pre-trained ViT at the fine-tuning resolution with a new head for `task`
    (default single-label; its `problem_type` saved in the config: the model's loss, and transformers' pipeline,
    follow it), and its image processor. (A trained model is loaded for inference by `tools.trained.load_model`.)"""
    task = task or task_for()
    check_base_checkpoint(model_args.model_name_or_path)  # cut short, or pickled code: one line, nothing run
    id2label = dict(enumerate(names))
    model = ViTFTForImageClassification.from_pretrained(
        model_args.model_name_or_path,
        id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
        image_size=model_args.image_size,
        problem_type=task.problem_type,
        # NaFlex asked for (`vit_ft.data.naflex`); unset keeps the checkpoint's own (SigLIP 2's num_patches)
        **({} if model_args.max_num_patches is None else {"max_num_patches": model_args.max_num_patches}),
        **({} if model_args.pooling is None else {"pooling": model_args.pooling}),
        **({} if getattr(model_args, "fc_norm", None) is None else {"fc_norm": model_args.fc_norm}),
        hidden_dropout_prob=model_args.hidden_dropout_prob,
        attention_probs_dropout_prob=model_args.attention_probs_dropout_prob,
        # None keeps the checkpoint's own rate (a timm checkpoint's, where its config records one)
        **({} if model_args.drop_path_rate is None else {"drop_path_rate": model_args.drop_path_rate}),
        # VPT's prompt tokens, an option of the model's blocks (`model/prompts.py`): new, as the head is
        **({"vpt_tokens": model_args.vpt_tokens, "vpt_deep": model_args.vpt_deep} if model_args.method == "vpt" else {}),
        cache_dir=model_args.cache_dir,
    )
    kernelize(model)  # the CPU kernels where the switch allows them, before LoRA wraps the layers
    # a head, a pooling head asked for, or the norm after the pooling (MAE's fc_norm: new, as MAE's fine-tuning)
    new_heads = ("classifier.", "distillation_classifier.", "attn_pool.", "fc_norm.", "prompts.")
    missing = [key for key in model.loading_report.newly_initialized if not key.startswith(new_heads)]
    if missing:
        raise ValueError(
            f"{model_args.model_name_or_path} lacks encoder weights {missing[:5]}{' ...' if len(missing) > 5 else ''}: "
            "fine-tuning starts from a complete pre-trained ViT; check that model_name_or_path is a ViTModel / "
            "ViTForImageClassification checkpoint of the same size."
        )
    if "zeroshot" in (model_args.method, getattr(model_args, "head_init", "zero")):  # from the text tower
        from ..model.zeroshot import zeroshot_head

        zeroshot_head(model, model_args.model_name_or_path, names, model_args.zeroshot_templates,
                      model_args.class_prompts, model_args.cache_dir)  # fmt: skip
    # transformers' image processor, timm's pretrained_cfg or the paper's [-1, 1] for a JAX .npz
    settings = checkpoint_normalization(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    if not settings:
        logger.warning(
            "No image processor in %s; using ViT's default normalisation (mean 0.5, std 0.5).",
            model_args.model_name_or_path,
        )
    height, width = model.config.image_hw
    # bicubic, as the training transforms resample, so that inference through the processor sees the same pixels
    processor = ViTImageProcessorPil(
        **settings, size={"height": height, "width": width}, resample=PILImageResampling.BICUBIC
    )
    return with_method(model, model_args), processor


def with_method(model: Any, model_args: ModelArguments) -> Any:
    """The method's trainable part: peft adapters (LoRA or another method), SSF's scales and shifts or VPT's
    prompt tokens, the rest frozen; the model as it is for the other methods."""
    if model_args.peft:
        from .lora import apply_lora

        return apply_lora(model, model_args)
    if model_args.method == "ssf":
        from .ssf import apply_ssf

        return apply_ssf(model)
    if model_args.method == "vpt":  # the prompts are the model's own (`model/prompts.py`): only the freezing here
        from .ssf import train_only

        return train_only(model, "VPT", ("vit.prompts",))
    return model


__all__ = ["build_model", "with_method"]
