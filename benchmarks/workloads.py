"""What the model sections time: the two contenders with identical weights, a random batch, one inference call
and one fine-tuning step, each timed to the device's end."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable

import torch
from transformers import ViTConfig, ViTForImageClassification

from vit_ft.arguments.fields import ModelArguments
from vit_ft.kernels import kernelize
from vit_ft.model.configuration_vit_ft import VIT_CONFIG_FIELDS, ViTFTConfig
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.training.model import with_method
from vit_ft.utils.timing import interleave

from .common import LEARNING_RATE, BenchmarkSettings


def build_contenders(
    settings: BenchmarkSettings, folder: str | os.PathLike
) -> tuple[ViTFTForImageClassification, ViTForImageClassification]:
    """Our model and transformers' ViT (SDPA attention) carrying identical weights: transformers' random
    initialisation, written with save_pretrained to `folder` and loaded by both."""
    config = settings.model_config()
    hf_config = ViTConfig(
        **{name: getattr(config, name) for name in VIT_CONFIG_FIELDS}, num_labels=config.num_labels
    )
    torch.manual_seed(settings.seed)
    ViTForImageClassification(hf_config).save_pretrained(folder)
    theirs = ViTForImageClassification.from_pretrained(folder, attn_implementation="sdpa").eval()
    ours = kernelize(ViTFTForImageClassification.from_pretrained(folder)).eval()
    return ours, theirs


def method_model(config: ViTFTConfig, method: str, seed: int) -> torch.nn.Module:
    """A random model of `config` made ready for `--method method` as fine-tuning makes it (kernels, then the
    method's trainable part: `vit_ft.training.model.with_method`, the recipes' defaults); `full` trains it all."""
    model_args = ModelArguments(model_name_or_path="benchmark", method=method)
    if method == "vpt":  # the prompts are the model's own: its config holds them
        config = copy.deepcopy(config)
        config.vpt_tokens, config.vpt_deep = model_args.vpt_tokens, model_args.vpt_deep
    torch.manual_seed(seed)
    return with_method(kernelize(ViTFTForImageClassification(config)), model_args)


def random_batch(config: ViTFTConfig, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pixels of the config's size and random labels, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    height, width = config.image_hw
    pixels = torch.randn(batch_size, config.num_channels, height, width, generator=generator)
    labels = torch.randint(0, max(config.num_labels, 1), (batch_size,), generator=generator)
    return pixels, labels


def _autocast(dtype: torch.dtype | None, device_type: str = "cpu") -> torch.autocast:
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a call is timed to its end (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def infer(model: torch.nn.Module, pixels: torch.Tensor, dtype: torch.dtype | None) -> None:
    with torch.inference_mode(), _autocast(dtype, pixels.device.type):
        model(pixel_values=pixels)
    _synchronize(pixels.device)


def adamw(model: torch.nn.Module, fused: bool = False) -> torch.optim.Optimizer:
    """torch's AdamW over the trainable parameters: its default implementation (a per-tensor loop on CPU), or
    the fused kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True if fused else None)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pixels: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype | None,
    after_step: Callable[[], None] | None = None,
) -> None:
    """Forward with the loss (under autocast for bf16), backward, optimizer step: one fine-tuning step;
    `after_step` runs before the gradients are cleared (AdaLoRA's rank allocation reads them)."""
    with _autocast(dtype, pixels.device.type):
        loss = model(pixel_values=pixels, labels=labels).loss
    loss.backward()
    optimizer.step()
    if after_step is not None:
        after_step()
    optimizer.zero_grad(set_to_none=True)
    _synchronize(pixels.device)


def interleave_training(
    settings: BenchmarkSettings,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    pixels: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype | None,
) -> dict[str, list[float]]:
    """Seconds per training step of each model with its optimizer, interleaved (see `interleave`)."""
    steps = {
        name: functools.partial(train_step, model, optimizers[name], pixels, labels, dtype)
        for name, model in models.items()
    }
    return interleave(steps, settings.warmup, settings.rounds)
