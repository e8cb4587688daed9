"""One run per output folder: an exclusive advisory lock (`fcntl.flock`) on `.vit_ft.lock` inside the folder,
taken before a command writes anything there and held until it ends. The kernel releases it when the process
exits, however it exits (a crash or `kill -9` included), so a lock is never stale; the file itself holds the
holder (pid, host, start time, command) for the message a second run prints, and is removed on a clean exit.

    with output_lock(folder, "finetune"):  # raises OutputLocked naming the holder when another run has it
        ...
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ".vit_ft.lock"


class OutputLocked(OSError):
    """Another run holds the output folder's lock."""


def _holder(lock_path: Path) -> str:
    """Who holds the lock, from the lock file (it may still be empty for a moment after it was taken)."""
    for _ in range(20):
        try:
            info = json.loads(lock_path.read_text(encoding="utf-8"))
            return (
                f"pid {info.get('pid')} on {info.get('host')}, {info.get('command', 'a run')} "
                f"started {info.get('started')}"
            )
        except (OSError, ValueError):
            time.sleep(0.05)
    return "a process that has not said who it is"


def _acquire(lock_path: Path) -> int:
    """An open descriptor of `lock_path` holding its exclusive lock; OutputLocked if another process has it.

    A holder removes the file when it ends: a descriptor locked on a file that is no longer at `lock_path` is
    dropped and the lock taken again on the new file, so that two runs can never both hold one.
    """
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputLocked(
                f"{lock_path.parent} is in use by another run ({_holder(lock_path)}); wait for it to end, "
                "or pass another --output_dir. Two runs writing into one folder would mix their files."
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextmanager
def output_lock(folder: str | os.PathLike, command: str = "vit-ft") -> Iterator[Path]:
    """Hold `folder`'s lock (the folder is created) for the block; OutputLocked when another run holds it.

    Yields the lock file's path. The lock is per process: call it in process 0 only under `accelerate launch`
    (`locked_by_process_zero`).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / LOCK_FILE
    fd = _acquire(lock_path)
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": command,
            "argv": sys.argv,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield lock_path
    finally:
        lock_path.unlink(missing_ok=True)  # while still held: the next run makes a new file
        os.close(fd)


@contextmanager
def output_lock_in_process_zero(
    folder: str | os.PathLike, command: str, process_index: int, world_size: int
) -> Iterator[None]:
    """`output_lock` taken by process 0 alone under `accelerate launch`; every process raises OutputLocked (with
    process 0's message) when it is held elsewhere, so that none waits for a process 0 that has stopped."""
    from .distributed import broadcast_object

    with contextlib.ExitStack() as stack:
        refusal = None
        if process_index == 0:
            try:
                stack.enter_context(output_lock(folder, command))
            except OutputLocked as error:
                refusal = str(error)
        if world_size > 1:
            refusal = broadcast_object(refusal)
        if refusal is not None:
            raise OutputLocked(refusal)
        yield


__all__ = ["LOCK_FILE", "OutputLocked", "output_lock", "output_lock_in_process_zero"]
