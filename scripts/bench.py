#!/usr/bin/env python
"""Benchmark vit_ft against transformers' ViT on this machine; writes a Markdown table and JSON.

python scripts/bench.py                                  # ViT-B/16 at 224 px, all sections (minutes)
python scripts/bench.py --quick                          # a tiny ViT, seconds
python scripts/bench.py --sections model,ceiling --dtypes bf16 --rounds 9
python scripts/bench.py --threads 2 --output-dir outputs/benchmark
python scripts/bench.py --sections gpu                   # on a GPU: ViT-B/16 at 384 px, bf16, batch 64

Method and sections: see vit_ft/benchmark.py; the latest numbers and what they mean: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from transformers.utils import logging as hf_logging

from vit_ft.benchmark import (
    SECTIONS,
    BenchmarkSettings,
    quick_settings,
    run_benchmark,
    to_markdown,
    write_results,
)


def parse_args(argv: list[str] | None) -> tuple[BenchmarkSettings, str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument("--output-dir", default="outputs/benchmark", help="where benchmark.md/.json go")
    args = parser.parse_args(argv)
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
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    settings = quick_settings(**overrides) if args.quick else BenchmarkSettings(**overrides)
    return settings, args.output_dir


def main(argv: list[str] | None = None) -> dict:
    settings, output_dir = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    hf_logging.set_verbosity_error()  # loading reports and progress bars would interleave with the table
    hf_logging.disable_progress_bar()
    result = run_benchmark(settings)
    markdown, data = write_results(result, output_dir)
    print(to_markdown(result))
    print(f"Wrote {markdown} and {data}")
    return result


if __name__ == "__main__":
    main()
