"""Run a command-line script in this process, as `python SCRIPT ARGS` runs it, without paying a fresh
interpreter's imports (5-10 s each for torch, transformers and datasets).

`run_script` executes the script file itself (`runpy`, as `__main__`, so its thin wrapper and its
`if __name__ == "__main__"` line are part of what runs) with `sys.argv`, the working folder and the environment
of the call, and returns what a subprocess would: the exit code, stdout and stderr (through pytest's `capfd`, so
writes to the file descriptors are caught too). An exception that escapes the command is what the interpreter
would make of it: its traceback on stderr and exit code 1, so that a "no traceback" check fails on it.

As in a fresh process, the root logger has no handler while the command runs (pytest's are put back after), so
the command's own logging set-up sends its log lines to stdout / stderr, where a user sees them. A module- or
session-scoped fixture, which cannot ask for `capfd`, passes None and the output is caught by `fd_capture`.

What a fresh process would not inherit is put back afterwards: environment variables, the working folder,
sys.argv and sys.path, signal handlers, logger levels and handlers, warning filters, torch's thread count, grad
mode, transformers' progress bars (each named in `Ran.restored` when the command changed it), and torch's, numpy's
and Python's random states. What cannot be put back (accelerate's process-wide state once a launcher's WORLD_SIZE
shaped it, or a variable huggingface_hub reads only when it is imported, like HF_ENDPOINT) needs a real
subprocess: keep those rows in one. HF_HUB_OFFLINE is the exception: huggingface_hub reads it into
`constants.HF_HUB_OFFLINE` at import, and the runner sets that constant (and datasets' copy) from the call's
environment, as a fresh process would have read it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import runpy
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _pytest.capture import FDCapture, MultiCapture  # what capfd is made of, for wider-scoped fixtures

from .conftest import REPO

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))
# the loggers setup_logging configures: vit_ft's and the script's. Created before a run so that their state is
# kept; a library's logger is kept only once the library is imported (its import sets its level and handler)
LOGGERS = ("vit_ft", "__main__")


@dataclass(frozen=True)
class Ran:
    """What `subprocess.run(..., capture_output=True, text=True)` would have returned, and the process state
    the command left changed (put back by the runner)."""

    returncode: int
    stdout: str
    stderr: str
    restored: tuple[str, ...] = ()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _loggers() -> dict[str, logging.Logger]:
    manager = logging.Logger.manager
    named = {name: logging.getLogger(name) for name in LOGGERS}
    return {
        "": logging.getLogger(),
        **named,
        **{name: lg for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)},
    }


def _logger_state(lg: logging.Logger) -> tuple:
    return lg.level, list(lg.handlers), lg.propagate, lg.disabled


def _library_bars() -> dict[str, tuple[bool, object]]:
    """datasets' and huggingface_hub's progress bars, where imported: (enabled, the function that enables them)."""
    found = {}
    if "datasets" in sys.modules:
        from datasets.utils import enable_progress_bars, is_progress_bar_enabled

        found["datasets"] = (is_progress_bar_enabled(), enable_progress_bars)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import are_progress_bars_disabled
        from huggingface_hub.utils import enable_progress_bars as enable_hub_bars

        found["huggingface_hub"] = (not are_progress_bars_disabled(), enable_hub_bars)
    return found


@contextlib.contextmanager
def kept_process_state(restored: list[str]) -> Iterator[None]:
    """Put back, on exit, the process state a command may change; append the name of each changed thing."""
    environ, cwd, argv, path = dict(os.environ), os.getcwd(), list(sys.argv), list(sys.path)
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    loggers = {name: (lg, _logger_state(lg)) for name, lg in _loggers().items()}
    threads, grad, rng = torch.get_num_threads(), torch.is_grad_enabled(), torch.get_rng_state()
    np_state, py_state = np.random.get_state(), random.getstate()
    hf_logging = sys.modules.get("transformers.utils.logging")
    bars = hf_logging.is_progress_bar_enabled() if hf_logging else None
    library_bars = _library_bars()
    try:
        with warnings.catch_warnings():  # the filters a command adds are dropped on exit
            yield
    finally:
        changed = sorted(k for k in set(os.environ) | set(environ) if os.environ.get(k) != environ.get(k))
        if changed:
            restored.append(f"os.environ {', '.join(changed)}")
            os.environ.clear()
            os.environ.update(environ)
        for name, value, current, put_back in (
            ("cwd", cwd, os.getcwd(), os.chdir),
            ("sys.argv", argv, sys.argv, lambda v: setattr(sys, "argv", v)),
            ("sys.path", path, sys.path, lambda v: setattr(sys, "path", v)),
            ("torch threads", threads, torch.get_num_threads(), torch.set_num_threads),
            ("torch grad mode", grad, torch.is_grad_enabled(), torch.set_grad_enabled),
        ):
            if current != value:
                restored.append(name)
                put_back(value)
        for sig, handler in handlers.items():
            if signal.getsignal(sig) != handler:
                restored.append(f"signal {signal.Signals(sig).name}")
                signal.signal(sig, handler)
        for name, (lg, state) in loggers.items():
            if _logger_state(lg) != state:
                restored.append(f"logger {name or 'root'}")
                level, lg.handlers[:], lg.propagate, lg.disabled = state
                lg.setLevel(level)
        if hf_logging and hf_logging.is_progress_bar_enabled() != bars:
            restored.append("transformers progress bars")
            (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        for name, (enabled, enable) in _library_bars().items():  # off in a log that is not a terminal
            if enabled != library_bars.get(name, (enabled,))[0]:
                restored.append(f"{name} progress bars")
                enable()
        torch.set_rng_state(rng)
        np.random.set_state(np_state)
        random.setstate(py_state)


@contextlib.contextmanager
def _hub_offline_as_imported() -> Iterator[None]:
    """huggingface_hub's (and datasets') offline constant as a process started with this environment reads it."""
    import huggingface_hub.constants as hub_constants

    offline = _truthy(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hub_constants, "HF_HUB_OFFLINE", offline)
        if "datasets.config" in sys.modules:
            patch.setattr(sys.modules["datasets.config"], "HF_HUB_OFFLINE", offline)
            patch.setattr(sys.modules["datasets.config"], "HF_DATASETS_OFFLINE", offline)
        yield


def _exit_code(script: Path) -> int:
    """Run `script` as `__main__` and return the exit code the interpreter would give."""
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)  # sys.exit("message"): the interpreter prints it, exit 1
        return 1
    except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught error
        traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def fd_capture() -> Iterator[MultiCapture[str]]:
    """`capfd` for a fixture wider than one test (module or session scope), which cannot ask for `capfd`: the
    file descriptors 1 and 2 (and sys.stdout / sys.stderr) go to temporary files while the block runs, as
    pytest's own `capfd` sends them; `readouterr()` returns what was written."""
    capture = MultiCapture(in_=None, out=FDCapture(1), err=FDCapture(2))
    capture.start_capturing()
    try:
        yield capture
    finally:
        capture.stop_capturing()


def run_script(
    script: str | Path,
    args: list[str],
    capfd: pytest.CaptureFixture[str] | MultiCapture[str] | None,
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
) -> Ran:
    """`python SCRIPT ARGS` in `cwd` with `env` added to this process's environment, run in this process.
    `script` is a path relative to the repository (scripts/predict.py, demo/app.py) or absolute. `capfd`: the
    test's; None in a module- or session-scoped fixture (the output is then caught by `fd_capture`)."""
    if capfd is None:
        with fd_capture() as capture:
            return run_script(script, args, capture, cwd, env)
    script = REPO / script
    capfd.readouterr()  # what came before is not the command's
    restored: list[str] = []
    with kept_process_state([]):  # undoes the call's own set-up
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = [str(script), *map(str, args)]
        # a fresh process's root logger has no handler, so the command's logging.basicConfig takes effect (its
        # log lines reach stdout / stderr as they do for a user) instead of pytest's log capture
        logging.getLogger().handlers.clear()
        with kept_process_state(restored), _hub_offline_as_imported():  # what the command changes
            code = _exit_code(script)
            sys.stdout.flush()
            sys.stderr.flush()
    out, err = capfd.readouterr()
    return Ran(code, out, err, tuple(restored))


__all__ = ["Ran", "fd_capture", "kept_process_state", "run_script"]
