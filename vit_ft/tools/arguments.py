"""The flags every tool that runs a model takes (`add_inference_arguments`) and the flags that pick its data
(`add_data_arguments`): predict, evaluate, inspect, few-shot and bench add them to their `tool_parser`."""

from __future__ import annotations

import argparse

from ..utils.cli import optional_int
from ..utils.limits import MAX_IMAGE_TOKENS


def add_inference_arguments(parser: argparse.ArgumentParser, batch_size: int) -> None:
    """`--image_size`, `--batch_size`, `--device`, `--max_tokens` and `--bf16`, as every tool that runs the model
    takes them."""
    parser.add_argument("--image_size", type=int, help="Test-time resolution (a multiple of the patch size).")
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available).")
    parser.add_argument("--max_tokens", type=optional_int, default=MAX_IMAGE_TOKENS,
                        help=f"Refuse an --image_size with more patch tokens per image (default {MAX_IMAGE_TOKENS}: "
                        "ViT-B/16 at 1024 px); 'none' disables.")  # fmt: skip
    parser.add_argument("--bf16", choices=("auto", "true", "false"), default="auto",
                        help="bf16 autocast (default auto: where it was measured faster, CUDA GPUs with bf16 and "
                        "AMD CPUs with native bf16; numbers may then differ from float32 in the last digits). "
                        "false keeps float32, e.g. to reproduce the fine-tune's own evaluation exactly.")  # fmt: skip


def add_data_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """`--recipe` or `--data_dir` (one of them), and `--seed`: which images `what` runs on."""
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--recipe", help=f"{what} on this recipe's data (name in recipes/ or a .yaml path).")
    data.add_argument(
        "--data_dir",
        help=f"{what} on an image folder laid out as <folder>/<class name>/<image>, or (multi-label) a folder with labels.csv / labels.jsonl beside the images.",
    )
    parser.add_argument(
        "--seed", type=int, help="Data seed (default: the fine-tune's, read from its run record)."
    )


__all__ = ["add_data_arguments", "add_inference_arguments"]
