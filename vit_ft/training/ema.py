"""An exponential moving average (EMA) of the weights, as timm's `ModelEmaV3`, kept by a Trainer callback.

After each optimizer step `s` (1, 2, ...: the Trainer's global_step once it has stepped) every trainable
parameter's average moves towards it: `ema = lerp(ema, weight, 1 - decay(s))`, with timm's
`ModelEmaV3.get_decay(step=s)`: 0 at the first step (the average starts as the weights after it), then
`ema_decay`, or with warm-up `min(ema_decay, 1 - (1 + (s - 1)) ** (-2/3))` (timm's defaults: gamma 1, power 2/3).
Only trainable parameters are averaged: a frozen one (LoRA's base weights) would average to itself.

The average is evaluated at each evaluation (`FineTuneTrainer` reports `eval_ema_*` beside `eval_*`), written
into each checkpoint as `ema.safetensors` (before the checkpoint's record vouches for its files), read back on
--resume so that the resumed average is bit for bit the uninterrupted one, and, with `ema_as_final_model`, copied
into the model at the end of training (from the best checkpoint when the Trainer loaded it).

Under several processes (DDP), every process updates its own copy from its own weights, which are identical
after each step (the gradients are all-reduced before the step), so the copies stay identical without any
communication; process 0 writes the file. Under FSDP2 each process averages its own shard (the parameters are
DTensors, and so is the average: no communication per step); saving gathers the whole tensors (every process
takes part, process 0 writes one consolidated `ema.safetensors`), and loading gives each process its shard of
the file again. The average is kept in float32 whatever the weights' dtype (bf16 weights, as DeepSpeed's with
bf16, would round its small updates away), and cast back to the weights' dtype only when copied into the model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainerCallback

EMA_FILE = "ema.safetensors"
WARMUP_GAMMA, WARMUP_POWER = 1.0, 2 / 3  # timm ModelEmaV3's defaults

logger = logging.getLogger("vit_ft")


def ema_decay_at(step: int, decay: float, warmup: bool = False) -> float:
    """timm's `ModelEmaV3.get_decay(step)` with update_after_step 0 and min_decay 0: the decay of update `step`."""
    step = max(0, step - 1)
    if step <= 0:
        return 0.0
    if warmup:
        return max(min(1 - (1 + step / WARMUP_GAMMA) ** -WARMUP_POWER, decay), 0.0)
    return decay


def _trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's trainable parameters by name; under FSDP2 its sharded ones (DTensors): a module a forward left
    unsharded (the root, with reshard_after_forward off) holds plain whole tensors until it is resharded."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def _whole(value: torch.Tensor) -> torch.Tensor:
    """`value` as one whole tensor: a DTensor shard is gathered from every process (all must call this)."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _like(whole: torch.Tensor, shadow: torch.Tensor) -> torch.Tensor:
    """`whole` laid out as `shadow`: this process's shard of it when `shadow` is a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(shadow, DTensor):
        return distribute_tensor(whole.to(shadow.device), shadow.device_mesh, shadow.placements)
    return whole


class WeightEMA:
    """The moving average of a model's trainable parameters, by name, in float32 (sharded as they are)."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = False) -> None:
        self.decay, self.warmup = decay, warmup
        self.shadow = {
            name: param.detach().to(torch.float32, copy=True)
            for name, param in _trainable_parameters(model).items()
        }

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Move the average towards the model's weights after optimizer step `step` (1 for the first)."""
        params = _trainable_parameters(model)
        weight = 1.0 - ema_decay_at(step, self.decay, self.warmup)
        torch._foreach_lerp_(
            list(self.shadow.values()), [params[name].detach().float() for name in self.shadow], weight
        )

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Overwrite the model's trainable parameters with the average (cast to their dtype)."""
        params = _trainable_parameters(model)
        for name, value in self.shadow.items():
            params[name].copy_(value)

    @contextlib.contextmanager
    def applied_to(self, model: nn.Module) -> Iterator[None]:
        """The average in the model's parameters for the duration of the block, the weights restored after."""
        saved = {name: param.detach().clone() for name, param in _trainable_parameters(model).items()}
        self.copy_to(model)
        try:
            yield
        finally:
            with torch.no_grad():
                params = _trainable_parameters(model)
                for name, value in saved.items():
                    params[name].copy_(value)

    @torch.no_grad()
    def save(self, path: str | Path, write: bool = True) -> None:
        """Write the average to `path` as whole float32 tensors when `write`. Under FSDP2 every process must
        call it (the shards are gathered one tensor at a time); process 0 alone passes `write`."""
        whole = {}
        for name, value in self.shadow.items():
            value = _whole(value)
            if write:
                whole[name] = value.detach().cpu().contiguous()
        if write:
            save_file(whole, str(path))

    @torch.no_grad()
    def load(self, path: str | Path) -> None:
        """Read an average written by `save` for the same trainable parameters (ValueError otherwise); every
        process reads the file and keeps its own shard."""
        if not Path(path).is_file():
            raise ValueError(
                f"{path} is missing: the checkpoint was written without ema_decay; resume with the settings of the "
                "run that wrote it, or start a new run."
            )
        values = load_file(str(path))
        if set(values) != set(self.shadow):
            missing = sorted(set(self.shadow) - set(values))[:3]
            raise ValueError(
                f"{path} does not hold the EMA of this model's trainable parameters (missing e.g. {missing}); "
                "resume with the same model and LoRA settings as the run that wrote it."
            )
        for name, value in values.items():
            self.shadow[name].copy_(_like(value.to(torch.float32), self.shadow[name]))


class EMACallback(TrainerCallback):
    """Keeps a `WeightEMA` through training: made at the start (read from the resumed checkpoint), updated at
    each step end, saved at each checkpoint, copied into the model at the end when it is the final model."""

    def __init__(self, decay: float, warmup: bool = False, as_final_model: bool = False,
                 resume_from: str | None = None) -> None:  # fmt: skip
        self.decay, self.warmup, self.as_final_model = decay, warmup, as_final_model
        self.resume_from = resume_from
        self.ema: WeightEMA | None = None
        self.evaluating = False  # True during training: evaluations then report the EMA too

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.ema = WeightEMA(model, self.decay, self.warmup)
        if self.resume_from is not None:
            self.ema.load(Path(self.resume_from) / EMA_FILE)
        self.evaluating = True

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.ema.update(model, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        # every process: under FSDP2 the shards are gathered; process 0 writes
        self.ema.save(folder / EMA_FILE, write=state.is_world_process_zero and folder.is_dir())

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.evaluating = False
        if not self.as_final_model:
            return
        if args.load_best_model_at_end and state.best_model_checkpoint:
            self.ema.load(Path(state.best_model_checkpoint) / EMA_FILE)  # the best checkpoint's average
        self.ema.copy_to(model)
        logger.info("The final model is the EMA of the weights (ema_as_final_model).")


__all__ = ["EMACallback", "EMA_FILE", "WeightEMA", "ema_decay_at"]
