"""Logging setup, in one place: vit_ft's messages (and the running script's) on stdout, the libraries at
their own level. The tools call `setup_logging()`; the fine-tune passes its process's levels
(`TrainingArguments.get_process_log_level()`, and WARNING for our messages on all but the main process)."""

from __future__ import annotations

import logging
import sys


def setup_logging(
    timestamps: bool = True,
    level: int = logging.INFO,
    library_level: int | None = None,
    loggers: tuple[str, ...] = ("vit_ft",),
) -> None:
    """The messages of `loggers` (vit_ft's; the fine-tune adds its script's `__main__`) at `level` on stdout;
    with `library_level`, transformers' and datasets' verbosity too (None leaves them as they are)."""
    fmt = "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(
        format=f"%(asctime)s {fmt}" if timestamps else fmt,
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    for name in loggers:
        logging.getLogger(name).setLevel(level)
    if library_level is not None:
        import datasets
        import transformers

        datasets.utils.logging.set_verbosity(library_level)
        transformers.utils.logging.set_verbosity(library_level)


__all__ = ["setup_logging"]
