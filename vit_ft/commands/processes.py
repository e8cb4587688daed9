"""`vit-ft finetune --num_processes N [--launch_config FILE] ...`: the fine-tune on N processes of this machine,
started by accelerate's own launcher (`accelerate.commands.launch.launch_command`, with its config file where one
is given), called in this process so that what the user and a scheduler see of it is the fine-tune's own:

- a user error stays one `error:` line, the last one (each process prints it: one line per process): the
  launcher's failure (subprocess.CalledProcessError from its one-process launcher, torch elastic's
  ChildFailedError from its several-process one) is caught here and never printed, torch elastic's own log of it
  is silenced in this process;
- the exit status is the processes': 1 for a user error, 75 after a preemption saved (any process's 75 wins),
  130 after Ctrl-C; 128 + N for a process killed by signal N, with one line saying so (it printed none);
- SIGTERM and SIGUSR1 sent to this process alone (`kill PID`, a container's stop) are passed on to the processes,
  which save at their next step and exit 75: the launcher runs in a thread, so neither accelerate's handler
  (1.16 stops the process tree 5 s after a SIGTERM) nor torch elastic's (30 s) is installed, and the run has the
  time it needs. Ctrl-C reaches every process of the terminal's group by itself: this process ignores it and
  waits for theirs.

`accelerate launch scripts/finetune.py ...` (the same command, the launcher's own process) shows the launcher's
traceback after our line and exits 1 whatever the script's status, 143 when signalled (docs/fine-tuning.md, which
tests/training/test_launcher.py pins on the oldest and newest accelerate of the range).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NUM_PROCESSES_FLAG = "--num_processes"
LAUNCH_CONFIG_FLAG = "--launch_config"
ENTRY_MODULE = "vit_ft.commands.finetune"
PREEMPTED_EXIT = 75  # vit_ft.training.preemption's (not imported here: the launcher loads no training code)
_FORWARDED = (signal.SIGTERM, signal.SIGUSR1)


def split_launch_flags(argv: Sequence[str]) -> tuple[int | None, str | None, list[str]]:
    """`--num_processes N` and `--launch_config FILE` (also as `--flag=value`) taken out of `argv`: (N or None
    when not given, FILE or None, the rest in order). Raises ValueError for a value that is missing or wrong,
    FileNotFoundError for a config file that is not there."""
    found: dict[str, str] = {}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        flag, equals, value = item.partition("=")
        if flag not in (NUM_PROCESSES_FLAG, LAUNCH_CONFIG_FLAG):
            rest.append(item)
            continue
        if not equals:
            value = next(items, "")
        if not value or value.startswith("--"):
            raise ValueError(
                f"{flag} needs a value; write e.g. {flag} {'2' if flag == NUM_PROCESSES_FLAG else 'FILE'}"
            )
        found[flag] = value
    if LAUNCH_CONFIG_FLAG in found and not Path(found[LAUNCH_CONFIG_FLAG]).is_file():
        raise FileNotFoundError(2, "no such file", found[LAUNCH_CONFIG_FLAG])
    number = found.get(NUM_PROCESSES_FLAG)
    if number is not None and not (number.isdigit() and int(number) >= 1):
        raise ValueError(f"{NUM_PROCESSES_FLAG} {number!r} is not a number of processes; pass 1 or more")
    return (int(number) if number is not None else None), found.get(LAUNCH_CONFIG_FLAG), rest


def launcher_args(num_processes: int | None, config_file: str | None, argv: Sequence[str]) -> Any:
    """accelerate launch's own arguments for `python -m vit_ft.commands.finetune ARGV` on `num_processes`
    processes (None: the config's): its config file's settings, or one machine, no launcher-side precision (the
    recipe's bf16 sets it, as under torchrun) and, for several processes, its several-process (torchrun)
    launcher."""
    from accelerate.commands.launch import launch_command_parser

    flags = [] if num_processes is None else ["--num_processes", str(num_processes)]
    if config_file is not None:
        flags += ["--config_file", config_file]
    else:
        num_processes = num_processes or 1
        flags += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        flags += ["--multi_gpu"] if num_processes > 1 else []
    return launch_command_parser().parse_args([*flags, "--module", ENTRY_MODULE, *argv])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_status(error: BaseException | None) -> tuple[int, str | None]:
    """The status to exit with after the launcher returned (`error` None) or raised `error`, and a line to print
    when no process printed one (a process killed by a signal). Raises `error` when it is the launcher's own
    (a wrong config file: ValueError; a bug)."""
    import subprocess

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if error is None:
        return 0, None
    if isinstance(error, SystemExit):  # accelerate's own exits (130 after Ctrl-C in its torchrun launcher)
        return (error.code if isinstance(error.code, int) else 1), None
    if isinstance(error, subprocess.CalledProcessError):
        statuses = {0: error.returncode}
    elif isinstance(error, ChildFailedError):
        statuses = {rank: failure.exitcode for rank, failure in sorted(error.failures.items())}
    else:
        raise error
    if PREEMPTED_EXIT in statuses.values():
        return PREEMPTED_EXIT, None
    # torch elastic SIGTERMs the processes still running once one has failed: those deaths follow the failure, the
    # status of a process that ended on its own (or was killed otherwise: SIGKILL, the OOM killer) says why
    causes = {rank: status for rank, status in statuses.items() if status != -signal.SIGTERM} or statuses
    rank, status = next(iter(causes.items()))
    if status >= 0:
        return status, None
    name = _signal_name(-status)
    return 128 - status, (
        f"error: the training process (rank {rank}) was killed by {name} before it could say why; a SIGKILL "
        "is often the out-of-memory killer. Run the same command with --resume to continue from the last "
        "complete checkpoint."
    )


def _forward(signum: int, frame: Any) -> None:
    """Pass a signal sent to this process on to the processes it started (the training processes)."""
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)


def _wait_for_the_processes(signum: int, frame: Any) -> None:
    """Ctrl-C: the terminal sent it to every process of its group; theirs is to stop, this one waits for them."""


def launch(num_processes: int | None, config_file: str | None, argv: Sequence[str]) -> tuple[int, str | None]:
    """Run the fine-tune with ARGV on `num_processes` processes (None: the config's) through accelerate's launcher (in a thread, with
    this thread passing SIGTERM / SIGUSR1 on and ignoring Ctrl-C) and return `exit_status`'s (status, line)."""
    from accelerate.commands.launch import launch_command

    args = launcher_args(num_processes, config_file, argv)
    # torch elastic logs a failed process (after its own error line) and the shutdown of the others: ours to say
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            launch_command(args)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which decides
            outcome.append(error)

    previous = {sig: signal.signal(sig, _forward) for sig in _FORWARDED}
    # not SIG_IGN, which the processes would inherit (and Python then leaves Ctrl-C ignored): a handler that waits
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, _wait_for_the_processes)
    thread = threading.Thread(target=run, name="accelerate-launch", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.2)  # a short join: the signal handlers run in this thread between waits
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_status(outcome[0] if outcome else None)


__all__ = ["LAUNCH_CONFIG_FLAG", "NUM_PROCESSES_FLAG", "exit_status", "launch", "launcher_args",
           "split_launch_flags"]  # fmt: skip
