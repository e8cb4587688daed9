"""Logging setup, in one place: vit_ft's messages (and the running script's) on stdout, the libraries at
their own level. The tools call `setup_logging()`; the fine-tune passes its process's levels
(`TrainingArguments.get_process_log_level()`, and WARNING for our messages on all but the main process)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .progress import is_terminal


def setup_logging(
    timestamps: bool = True,
    level: int = logging.INFO,
    library_level: int | None = None,
    loggers: tuple[str, ...] = ("vit_ft",),
) -> None:
    """The messages of `loggers` (vit_ft's; the fine-tune adds its script's `__main__`) at `level` on stdout;
    with `library_level`, transformers' and datasets' verbosity too (None leaves them as they are); the
    libraries' bars off where stderr is not a terminal (`plain_library_logs`)."""
    plain_library_logs()
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


def plain_library_logs(terminal: bool | None = None) -> None:
    """Where stderr is not a terminal (`terminal`; None: find out), as under Slurm, nohup or `accelerate
    launch`'s pipe, the libraries' own tqdm bars off (transformers' weight loading, datasets' passes, the Hub's
    downloads): they would write escape codes and carriage returns into the log. Ours print plain lines there
    (`utils.progress`); a terminal keeps every bar. Libraries imported later read the environment."""
    if is_terminal() if terminal is None else terminal:
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars as disable_dataset_bars

        disable_dataset_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


@contextmanager
def no_dataset_bars() -> Iterator[None]:
    """datasets' progress bars off for the block (a local folder's "Downloading data" / "Generating split"
    bars say nothing to a user: nothing is downloaded), as they were after it."""
    from datasets.utils import disable_progress_bars, enable_progress_bars, is_progress_bar_enabled

    enabled = is_progress_bar_enabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            enable_progress_bars()


__all__ = ["no_dataset_bars", "plain_library_logs", "setup_logging"]
