"""Running the selected sections into one result, and the command line that scripts/bench.py calls."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from vit_ft.utils.cli import ToolArgumentParser

from .common import (
    SECTIONS,
    BenchmarkSettings,
    Row,
    cpu_compute,
    machine_info,
    quick_settings,
    without_emulated,
)
from .compiled import bench_compile
from .data import bench_data
from .gpu import bench_gpu, gpu_available
from .lora import bench_lora
from .model import bench_model
from .onnx import bench_onnx, onnx_available
from .pipeline import bench_pipeline
from .profile import bench_profile
from .report import repeated_markdown, summarize_runs, to_markdown, write_results
from .workloads import build_contenders

logger = logging.getLogger(__name__)


def run_benchmark(settings: BenchmarkSettings) -> dict[str, Any]:
    """Run the selected sections; returns {"machine", "settings", "kernels", "rows", "notes", "load_average",
    ...}. CPU rows this CPU would run in emulated bf16 are skipped, with a line (`common.without_emulated`)."""
    settings, skipped = without_emulated(settings)
    for line in skipped:
        logger.warning(line)
    threads = torch.get_num_threads()
    try:
        if settings.threads:
            torch.set_num_threads(settings.threads)
        return _run_sections(settings, skipped)
    finally:
        torch.set_num_threads(threads)


def _run_sections(settings: BenchmarkSettings, notes: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    load_before = os.getloadavg()
    rows: list[Row] = []
    notes = list(notes)
    computes = {name: cpu_compute(name) for name in settings.dtypes}  # which kernels the CPU rows run
    for name, compute in computes.items():
        logger.info("%s rows: %s", name, compute.line())
    gpu = "gpu" in settings.sections and gpu_available(settings)
    if "gpu" in settings.sections and not gpu:
        notes.append(
            f"No {settings.gpu_device} device here: the gpu rows ({settings.gpu_image_size} px, bf16, batch "
            f"{settings.gpu_batch_size}) were not measured."
        )
    onnx = "onnx" in settings.sections and onnx_available()
    if "onnx" in settings.sections and not onnx:
        notes.append("onnx, onnxscript or onnxruntime is not installed: the onnx rows were not measured.")
    with tempfile.TemporaryDirectory() as folder:
        model_sections = [s for s in ("model", "ceiling") if s in settings.sections]
        if {"model", "ceiling", "profile", "compile"} & set(settings.sections) or onnx:
            ours, theirs = build_contenders(settings, folder)
            if model_sections:
                rows.extend(bench_model(settings, ours, theirs, model_sections))
            if "profile" in settings.sections:
                rows.extend(bench_profile(settings, ours))
            if "compile" in settings.sections:
                rows.extend(bench_compile(settings, ours, theirs))
            if onnx:
                rows.extend(bench_onnx(settings, ours, folder))
            del ours, theirs
        elif {"lora", "pipeline"} & set(settings.sections):
            build_contenders(settings, folder)  # both load the checkpoint it writes to `folder`
        if "lora" in settings.sections:
            rows.extend(bench_lora(settings, folder))
        if "pipeline" in settings.sections:
            rows.extend(bench_pipeline(settings, folder))
        if gpu:
            rows.extend(bench_gpu(settings, folder))
    if "data" in settings.sections:
        rows.extend(bench_data(settings))
    load_after = os.getloadavg()
    busiest = max(load_before[0], load_after[0])
    if busiest > 1.5 * torch.get_num_threads():  # ours alone loads one per thread
        notes.append(
            f"The machine was busy (1-minute load average up to {busiest:.1f} on {os.cpu_count()} CPUs): other "
            "processes took cores mid-run, so ratios may be far from a quiet machine's; wide per-round ranges "
            "show it. Rerun when the machine is idle."
        )
    return {
        "machine": machine_info(),
        "settings": asdict(settings),
        "kernels": {name: compute.record() for name, compute in computes.items()},
        "rows": [asdict(row) for row in rows],
        "notes": notes,
        "load_average": {"before": load_before, "after": load_after},
        "elapsed_s": time.perf_counter() - start,
    }


# ---------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------


def parse_args(
    argv: list[str] | None, description: str | None = None
) -> tuple[BenchmarkSettings, argparse.Namespace]:
    """The settings, and the flags about the runs themselves (output folder, repeats), from the command line;
    `description` heads --help."""
    parser = ToolArgumentParser(description)
    parser.add_argument("--quick", action="store_true", help="a tiny ViT and small photos: a smoke run")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {SECTIONS}")
    parser.add_argument("--dtypes", default=None, help="comma-separated, from fp32,bf16 (default: both)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timed rounds")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per contender first")
    parser.add_argument("--batch-size", type=int, default=None, help="inference batch size")
    parser.add_argument("--train-batch-size", type=int, default=None, help="training batch size")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--gpu-device", default=None, help="device of the gpu section (default: cuda)")
    parser.add_argument("--gpu-image-size", type=int, default=None, help="gpu section image size (384)")
    parser.add_argument("--gpu-batch-size", type=int, default=None, help="gpu section batch size (64)")
    parser.add_argument(
        "--compile-backend", default=None, help="torch.compile backend of the compile section (inductor)"
    )
    parser.add_argument("--output-dir", default="outputs/benchmark", help="where benchmark.md/.json go")
    parser.add_argument("--repeat", type=int, default=1,
                        help="separate runs, each a fresh process, --pause seconds apart; the table then gives each "
                        "measurement's median ratio with the lowest and highest run (report these, not one run)")  # fmt: skip
    parser.add_argument(
        "--pause", type=float, default=60.0, help="seconds between repeated runs (default 60)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.pause < 0:
        raise ValueError(f"--repeat {args.repeat} must be >= 1 and --pause {args.pause} >= 0.")
    overrides = {
        "sections": tuple(s.strip() for s in args.sections.split(",") if s.strip()),
        "dtypes": tuple(d.strip() for d in args.dtypes.split(",")) if args.dtypes else None,
        "threads": args.threads,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "infer_batch_size": args.batch_size,
        "train_batch_size": args.train_batch_size,
        "measure_memory": False if args.no_memory else None,
        "gpu_device": args.gpu_device,
        "gpu_image_size": args.gpu_image_size,
        "gpu_batch_size": args.gpu_batch_size,
        "compile_backend": args.compile_backend,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    settings = quick_settings(**overrides) if args.quick else BenchmarkSettings(**overrides)
    return settings, args


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    """Parse the command line, run, write benchmark.md and benchmark.json, print the table; with --repeat N,
    N separate runs and the table of their medians and ranges."""
    argv = sys.argv[1:] if argv is None else argv
    settings, args = parse_args(argv, description)
    if args.repeat > 1:
        return repeat_runs(argv, args.repeat, args.pause, Path(args.output_dir))
    output_dir = args.output_dir
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    hf_logging.set_verbosity_error()  # loading reports and progress bars would interleave with the table
    hf_logging.disable_progress_bar()
    result = run_benchmark(settings)
    markdown, data = write_results(result, output_dir)
    print(to_markdown(result))
    print(f"Wrote {markdown} and {data}")
    return result


def _without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` less each of `flags` and its value (`--flag value` or `--flag=value`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in flags)):
            kept.append(arg)
    return kept


def repeat_runs(argv: list[str], repeat: int, pause: float, output_dir: Path) -> dict:
    """`repeat` runs of scripts/bench.py with the same flags, each a fresh process writing `output_dir/run-K`,
    `pause` seconds apart; then benchmark-repeated.md/.json in `output_dir` and the table on stdout."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"
    base = _without_flags(argv, ("--repeat", "--pause", "--output-dir"))
    results = []
    for index in range(1, repeat + 1):
        if index > 1:
            print(f"Pausing {pause:.0f} s before run {index} of {repeat}.", flush=True)
            time.sleep(pause)
        run_dir = output_dir / f"run-{index}"
        print(f"Run {index} of {repeat} -> {run_dir}", flush=True)
        done = subprocess.run([sys.executable, str(script), *base, "--output-dir", str(run_dir)], check=False)
        if done.returncode != 0:
            raise OSError(
                f"benchmark run {index} of {repeat} failed (exit {done.returncode}); see its output above."
            )
        results.append(json.loads((run_dir / "benchmark.json").read_text(encoding="utf-8")))
    summary = summarize_runs(results)
    markdown = repeated_markdown(summary)
    (output_dir / "benchmark-repeated.md").write_text(markdown, encoding="utf-8")
    (output_dir / "benchmark-repeated.json").write_text(
        json.dumps(summary, indent=2) + "\n", encoding="utf-8"
    )
    print(markdown)
    print(f"Wrote {output_dir / 'benchmark-repeated.md'} and {output_dir / 'benchmark-repeated.json'}")
    return summary
