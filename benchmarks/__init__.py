"""Benchmarks on this machine: our ViT against transformers' ViT, the matrix-product ceiling, LoRA against full
fine-tuning, the training image pipeline against a naive decode, and on a GPU ViT-B/16 at 384 px in bf16.

A tool, not library code: this package imports vit_ft and nothing in vit_ft imports it. It is not
installed (pyproject installs vit_ft only); scripts/bench.py runs it from this checkout.

Method, in every section: the contenders run interleaved within one run. After `warmup` untimed calls each,
every round calls each contender once, in an order rotated by one per round, so that a burst of load from other
processes lands on all of them alike. A contender's figure is its median over the rounds; the headline is the
ratio of medians, with the range of the per-round ratios (two calls seconds apart) beside it as its noise. No
absolute number is reported without a ratio next to it: on a shared machine only the ratios carry over.

    python scripts/bench.py                        # ViT-B/16 at 224 px, every section: minutes on 2 cores
    python scripts/bench.py --quick                # a tiny ViT, seconds (the smoke test runs this)
    python scripts/bench.py --sections model,ceiling
    python scripts/bench.py --sections profile     # our inference time by kind of operation (torch.profiler)
    python scripts/bench.py --sections compile     # both models eager and under torch.compile (minutes: inductor)
    python scripts/bench.py --sections gpu         # where CUDA is available; otherwise a note, no failure

Modules: common (settings, rows, machine description; the interleaved timing is `vit_ft.utils.timing`), flops (analytic and counted FLOPs),
workloads (the contenders and the calls timed), model (ours against transformers' ViT, and the ceiling), profile
(where our inference time goes, by kind of operation: the account of the ceiling row), compiled
(both eager and under torch.compile), lora, peft_costs (every fine-tuning method's trainable parameters, step
time and peak memory beside LoRA's: `python -m benchmarks.peft_costs`, its own command, not a section),
data, pipeline (evaluate's loop against the bare forward), gpu (one per section), report (Markdown and JSON), run (running the sections; the command line).
"""
from vit_ft.utils.timing import interleave

from .common import SECTIONS, BenchmarkSettings, Row, machine_info, quick_settings
from .data import naive_train_transform, synthetic_photo
from .flops import Gemm, count_flops, forward_flops, forward_gemms
from .lora import training_memory_probe
from .model import MatmulCeiling
from .report import to_markdown, write_results
from .run import run_benchmark
from .workloads import build_contenders

__all__ = [
    "SECTIONS",
    "BenchmarkSettings",
    "Gemm",
    "MatmulCeiling",
    "Row",
    "build_contenders",
    "count_flops",
    "forward_flops",
    "forward_gemms",
    "interleave",
    "machine_info",
    "naive_train_transform",
    "quick_settings",
    "run_benchmark",
    "synthetic_photo",
    "to_markdown",
    "training_memory_probe",
    "write_results",
]
