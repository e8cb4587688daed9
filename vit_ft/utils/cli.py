"""What the command-line tools (predict, evaluate, inspect, push, bench, seeds, the demo) share: a parser
whose mistakes are errors like any other, `--model`, and `run_tool`, the one place that
turns a user's mistake into one line on stderr and exit code 1. The flags of the tools that run a model on
data are in `vit_ft.tools.arguments` (they know the model's limits)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

DEBUG_FLAG = "--debug"
DEBUG_ENV = "VIT_FT_DEBUG"
DEBUG_HELP = f"{DEBUG_FLAG} (or {DEBUG_ENV}=1) shows the traceback of an error instead of its one line."


class ToolArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes (an unknown flag, a missing or malformed value) raise ValueError, so
    that `run_tool` reports them as one `error:` line with exit 1 like every other mistake (argparse itself
    prints its usage and exits 2). Flags are never abbreviated: a misspelt `--privat` is an error, not
    `--private`."""

    def __init__(self, description: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("epilog", DEBUG_HELP)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{message} (run {self.prog} --help for the usage)")


def tool_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, with `--model` (folder, adapter folder or Hub id)."""
    parser = ToolArgumentParser(doc)
    parser.add_argument("--model", required=True, help="vit_ft model folder, LoRA adapter folder, or Hub id.")
    return parser


def optional_int(text: str) -> int | None:
    """An int flag whose 'none' (or 'null') means no value."""
    return None if text.lower() in ("none", "null") else int(text)


# What a user can cause: a bad path or value, a missing or corrupt model, no network. Anything else (a
# TypeError, an AttributeError, ...) is a bug in vit_ft and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, KeyboardInterrupt)


def _is_offline_error(error: BaseException) -> bool:
    """huggingface_hub's offline mode, or a connection that could not be made."""
    try:
        from huggingface_hub.errors import OfflineModeIsEnabled
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return isinstance(error, ConnectionError)
    return isinstance(error, (OfflineModeIsEnabled, ConnectionError)) or "offline mode" in str(error).lower()


def error_line(error: BaseException) -> str:
    """The one line that `run_tool` prints for `error`: `error: <what is wrong>. <what to do>`."""
    if isinstance(error, KeyboardInterrupt):
        return "error: interrupted. Run the command again to finish (predict keeps an existing --output as it was)."
    if isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)) and (
        error.filename is not None
    ):
        what = {
            FileNotFoundError: "no such file or folder",
            NotADirectoryError: "not a folder",
            IsADirectoryError: "is a folder, not a file",
            PermissionError: "permission denied",
        }[type(error)]
        text = f"{error.filename}: {what}. Check the path"
    elif _is_offline_error(error) and "network" not in str(error):
        text = f"{_message(error)} This needs the network: connect, or pass a local model folder."
    else:
        text = _message(error)
    text = text.rstrip()
    return f"error: {text}" if text.endswith((".", "?", "!", ")")) else f"error: {text}."


def _message(error: BaseException) -> str:
    """The error's text on one line (tracebacks of chained errors and multi-line messages folded; an error a
    DataLoader worker raised, which torch re-raises with the worker's traceback in its message, as its own;
    without a leading "Error", which the line's own "error:" would double)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else error  # str(KeyError) adds quotes
    text = " ".join(_worker_message(str(text)).split())
    return _LEADING_ERROR.sub("", text) or type(error).__name__


# transformers' "Error no file named model.safetensors ...": the line already starts with "error:"
_LEADING_ERROR = re.compile(r"^error\b:?\s*", re.IGNORECASE)


# torch's `ExceptionWrapper.reraise`: "Caught <type> in DataLoader worker process <n>.\nOriginal Traceback ..."
_WORKER_ERROR = re.compile(r"Caught (\w+) in DataLoader worker process \d+\.\s+Original Traceback")


def _worker_message(text: str) -> str:
    """The message of the exception a DataLoader worker raised: the last `<type>: ` line of its traceback."""
    caught = _WORKER_ERROR.match(text)
    if caught is None:
        return text
    lines = list(re.finditer(rf"\n(?:[\w.]+\.)?{caught.group(1)}: ", text))
    return text[lines[-1].end() :] if lines else text


def _close_progress_bars() -> None:
    """Close tqdm's open bars, so that none redraws itself after the error line at exit."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)  # only bars that exist: never import tqdm here
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def _debug_requested(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def run_tool(
    main: Callable[..., Any],
    argv: list[str] | None = None,
    interrupted: Callable[[], str] | None = None,
    **kwargs: Any,
) -> NoReturn:
    """Run a tool's `main(argv, **kwargs)` as a command: exit 0 when it returns; on an error the user caused
    (USER_ERRORS) print `error: <what is wrong>. <what to do>` to stderr and exit 1, with no traceback
    unless `--debug` is among the arguments or VIT_FT_DEBUG=1. Other exceptions are bugs: they propagate
    with their traceback. `--debug` is removed from the arguments before `main` parses them. Ctrl-C exits 130,
    with `interrupted()` as its line when given (e.g. where the last checkpoint is)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(argv)
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        main(argv, **kwargs)
    except USER_ERRORS as error:
        if debug:
            traceback.print_exc()
        sys.stdout.flush()
        interrupt = isinstance(error, KeyboardInterrupt)
        _close_progress_bars()  # an error inside a loop (a full disk while saving) leaves its bar open
        line = f"error: {interrupted()}" if interrupt and interrupted is not None else error_line(error)
        print(line, file=sys.stderr)
        sys.exit(130 if interrupt else 1)
    sys.exit(0)


__all__ = [
    "USER_ERRORS",
    "ToolArgumentParser",
    "error_line",
    "optional_int",
    "run_tool",
    "tool_parser",
]
