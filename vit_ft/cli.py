"""What the command-line tools (scripts/predict.py, evaluate_model.py, inspect_model.py, push_to_hub.py)
share: their logging and the arguments that name a model and its data."""

from __future__ import annotations

import argparse
import logging
import sys


def tool_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, with `--model` (folder, adapter folder or Hub id)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="vit_ft model folder, LoRA adapter folder, or Hub id.")
    return parser


def add_inference_arguments(parser: argparse.ArgumentParser, batch_size: int) -> None:
    """`--image_size`, `--batch_size` and `--device`, as every tool that runs the model takes them."""
    parser.add_argument("--image_size", type=int, help="Test-time resolution (a multiple of the patch size).")
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available).")


def add_data_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """`--recipe` or `--data_dir` (one of them), and `--seed`: which images `what` runs on."""
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--recipe", help=f"{what} on this recipe's data (name in recipes/ or a .yaml path).")
    data.add_argument("--data_dir", help=f"{what} on an image folder laid out as <folder>/<class name>/<image>.")
    parser.add_argument("--seed", type=int, help="Data seed (default: the fine-tune's, read from its run record).")


def setup_logging(timestamps: bool = True) -> None:
    """vit_ft's messages at INFO on stdout (the libraries keep their own levels)."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if timestamps else "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(format=fmt, datefmt="%H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    logging.getLogger("vit_ft").setLevel(logging.INFO)


__all__ = ["add_data_arguments", "add_inference_arguments", "setup_logging", "tool_parser"]
