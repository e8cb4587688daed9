"""What each fine-tuning method costs (issue 47, item 5): for every `--method` that trains a part of the model
(the peft methods, SSF, VPT) and full fine-tuning, on one random model: trainable parameters, the training
step's time and the peak training memory, each beside LoRA's.

    python -m benchmarks.peft_costs                       # ViT-S/16 at 224 px, 10 labels, batch 8, fp32, 5 rounds
    python -m benchmarks.peft_costs --rounds 3 --threads 1 --no-memory
    python -m benchmarks.peft_costs --quick               # a tiny ViT: seconds

Each method's model is made as fine-tuning makes it (`workloads.method_model`: the recipes' defaults), with
fused AdamW over its trainable parameters. The steps are timed interleaved (`vit_ft.utils.timing.interleave`:
one step of every method per round, the order rotated each round); a method's time is its median over the
rounds, its ratio the ratio of medians to LoRA's, with the range of the per-round ratios beside it. AdaLoRA's
step includes its rank allocation (`update_and_allocate`, as `AdaLoraCallback` calls it after every optimizer
step). Peak memory is the `lora` section's probe: a fresh process per method, two steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from vit_ft.arguments.fields import PEFT_METHODS
from vit_ft.training.lora import count_parameters
from vit_ft.utils.timing import interleave

from .common import BenchmarkSettings, machine_info, quick_settings
from .lora import _peak_training_memory
from .workloads import adamw, method_model, random_batch, train_step

# LoRA first (the reference), then the other peft methods, the two of our model, and full fine-tuning
COST_METHODS = (*PEFT_METHODS, "ssf", "vpt", "full")


@dataclasses.dataclass
class MethodCost:
    """One method's row: trainable parameters, step seconds over the rounds, peak MiB (None: not measured)."""

    method: str
    trainable: int
    total: int
    step_s: list[float]
    peak_mib: float | None = None


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, pixels: torch.Tensor,
          labels: torch.Tensor) -> None:  # fmt: skip
    """One fp32 training step; AdaLoRA's rank allocation after it, as in training."""
    allocate = getattr(getattr(model, "base_model", None), "update_and_allocate", None)
    step = getattr(model, "_cost_steps", 0) + 1
    model._cost_steps = step  # the allocation's schedule reads the global step
    train_step(model, optimizer, pixels, labels, None, functools.partial(allocate, step) if allocate else None)


def method_models(settings: BenchmarkSettings, methods: tuple[str, ...] = COST_METHODS) -> dict[str, torch.nn.Module]:
    """Each method's model of `settings`' config, in training mode (the same random backbone for all)."""
    return {method: method_model(settings.model_config(), method, settings.seed).train() for method in methods}


def measure_costs(
    settings: BenchmarkSettings, methods: tuple[str, ...] = COST_METHODS, models: dict[str, torch.nn.Module] | None = None
) -> list[MethodCost]:
    """Every method's trainable parameters and interleaved fp32 step times on `settings`' model (one batch of
    `train_batch_size` random images; `models` from `method_models`, made here when None), and with
    `measure_memory` its peak training memory."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    config = settings.model_config()
    models = models if models is not None else method_models(settings, methods)
    optimizers = {method: adamw(model, fused=True) for method, model in models.items()}
    pixels, labels = random_batch(config, settings.train_batch_size, settings.seed + 3)
    steps = {m: functools.partial(_step, models[m], optimizers[m], pixels, labels) for m in methods}
    times = interleave(steps, settings.warmup, settings.rounds)
    costs = [MethodCost(m, *count_parameters(models[m]), times[m]) for m in methods]
    del models, optimizers, steps
    if settings.measure_memory:
        for cost in costs:
            cost.peak_mib = _peak_training_memory(settings, cost.method, "fp32")
    return costs


def _ratio(costs: list[MethodCost], cost: MethodCost, reference: str) -> str:
    """Median step time over the reference's, with the range of the per-round ratios."""
    ref = next(c for c in costs if c.method == reference)
    per_round = [mine / theirs for mine, theirs in zip(cost.step_s, ref.step_s, strict=True)]
    median = statistics.median(cost.step_s) / statistics.median(ref.step_s)
    return f"{median:.2f} ({min(per_round):.2f}-{max(per_round):.2f})"


def to_markdown(costs: list[MethodCost], reference: str = "lora") -> str:
    """The table: one row per method, times and memory as multiples of the reference's."""
    ref = next(c for c in costs if c.method == reference)
    lines = [
        f"| method | trainable parameters | % of all | step time / {reference} (per-round range) | "
        f"step (ms, median) | peak memory (MiB) | memory / {reference} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cost in costs:
        peak = "-" if cost.peak_mib is None else f"{cost.peak_mib:.0f}"
        ratio = "-" if cost.peak_mib is None or not ref.peak_mib else f"{cost.peak_mib / ref.peak_mib:.2f}"
        lines.append(f"| {cost.method} | {cost.trainable:,} | {100 * cost.trainable / cost.total:.2f} | "
                     f"{_ratio(costs, cost, reference)} | {1000 * statistics.median(cost.step_s):.0f} | {peak} | "
                     f"{ratio} |")  # fmt: skip
    return "\n".join(lines)


def _settings(args: argparse.Namespace) -> BenchmarkSettings:
    common: dict[str, Any] = {"rounds": args.rounds, "warmup": args.warmup, "measure_memory": not args.no_memory,
                              "sections": ("lora",), "dtypes": ("fp32",)}  # fmt: skip
    if args.threads:
        common["threads"] = args.threads
    if args.quick:
        return quick_settings(**common)
    return BenchmarkSettings(variant="small", num_labels=10, train_batch_size=args.batch_size, **common)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(COST_METHODS), help="comma-separated; lora is the reference")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory probes")
    parser.add_argument("--quick", action="store_true", help="a tiny ViT (2 layers, 32 px): seconds")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and the machine here")
    args = parser.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = sorted(set(methods) - set(COST_METHODS))
    if unknown or "lora" not in methods:
        parser.error(f"--methods {args.methods}: every method one of {', '.join(COST_METHODS)}, lora among them")
    settings = _settings(args)
    costs = measure_costs(settings, methods)
    print(to_markdown(costs))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "settings": dataclasses.asdict(settings),
                                         "costs": [dataclasses.asdict(c) for c in costs]}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()


__all__ = ["COST_METHODS", "MethodCost", "measure_costs", "method_models", "to_markdown"]
