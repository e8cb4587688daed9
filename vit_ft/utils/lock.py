"""One run per output folder: an exclusive advisory lock (`fcntl.flock`) on `.vit_ft.lock` inside the folder,
taken before a command writes anything there and held until it ends. The kernel releases it when the process
exits, however it exits (a crash or `kill -9` included), so a lock is never stale; the file itself holds the
holder (pid, host, start time, command) for the message a second run prints, and is removed on a clean exit.

Where the file system has no `flock` (Lustre mounted without `-o flock`: ENOLCK, EOPNOTSUPP or ENOSYS), the lock
is the file itself, created with O_CREAT | O_EXCL (one log line says so). The kernel cannot free that one: a
file whose pid is dead on this host is cleared (with a log line); one left by a run on another host is deleted
by hand, as the refusal says.

    with output_lock(folder, "finetune"):  # raises OutputLocked naming the holder when another run has it
        ...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LOCK_FILE = ".vit_ft.lock"
# what fcntl.flock raises where the file system does not lock (Lustre without -o flock, some NFS setups)
FLOCK_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

logger = logging.getLogger("vit_ft")


class OutputLocked(OSError):
    """Another run holds the output folder's lock."""


def _holder_info(lock_path: Path) -> dict[str, Any] | None:
    """The lock file's holder record (it may still be empty for a moment after it was taken); None if unread."""
    for _ in range(20):
        try:
            info = json.loads(lock_path.read_text(encoding="utf-8"))
            if isinstance(info, dict):
                return info
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return None


def _describe(info: dict[str, Any] | None) -> str:
    if info is None:
        return "a process that has not said who it is"
    return (
        f"pid {info.get('pid')} on {info.get('host')}, {info.get('command', 'a run')} "
        f"started {info.get('started')}"
    )


def _holder(lock_path: Path) -> str:
    """Who holds the lock, from the lock file."""
    return _describe(_holder_info(lock_path))


def _holder_record(command: str) -> bytes:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": command,
        "argv": sys.argv,
    }
    return json.dumps(info).encode()


def _flock_supported(folder: Path) -> bool:
    """Whether `fcntl.flock` works in `folder` (probed with a shared lock on the folder itself, which no run
    holds exclusively); False where the file system answers ENOLCK, EOPNOTSUPP or ENOSYS."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as error:
        if error.errno in FLOCK_UNSUPPORTED:
            return False
        raise
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _stale(info: dict[str, Any] | None) -> bool:
    """A lock file left by a run that is gone: its host is this one and its pid is dead. A run on another host
    cannot be checked from here (the refusal says to delete the file)."""
    if info is None or info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    return not _process_alive(info["pid"])


def _acquire_exclusive_file(lock_path: Path, command: str) -> int:
    """The lock file created with O_CREAT | O_EXCL and holding this process's record (no flock here);
    OutputLocked naming the holder when it exists, after clearing it once if its pid is dead on this host."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            info = _holder_info(lock_path)
            if _stale(info):
                _clear_stale(lock_path, info)
                continue
            raise OutputLocked(
                f"{lock_path.parent} is in use by another run ({_describe(info)}); wait for it to end, or pass "
                "another --output_dir. Two runs writing into one folder would mix their files. If no run holds "
                f"it (it ran on another host and is gone), delete {lock_path}."
            ) from None
        try:
            os.pwrite(fd, _holder_record(command), 0)
        except BaseException:
            lock_path.unlink(missing_ok=True)  # an empty lock file would refuse every later run
            os.close(fd)
            raise
        return fd


def _clear_stale(lock_path: Path, info: dict[str, Any]) -> None:
    """Remove a stale lock file. It is first renamed aside and read again, so that a fresh lock a concurrent
    run has just made in its place is put back rather than removed."""
    aside = lock_path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
    try:
        os.rename(lock_path, aside)
    except FileNotFoundError:
        return  # another run cleared it first
    try:
        moved = json.loads(aside.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        moved = None
    if moved != info:  # a new holder's file: put it back where it was (unless yet another run made one)
        with contextlib.suppress(FileExistsError):
            os.link(aside, lock_path)
        aside.unlink(missing_ok=True)
        return
    aside.unlink(missing_ok=True)
    logger.warning(
        "Removed the stale lock %s: its run (%s) is no longer alive on this host.", lock_path, _describe(info)
    )


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


def lock_holder(folder: str | os.PathLike) -> str | None:
    """Who holds `folder`'s lock now ("pid 12 on host, finetune started ..."), or None when no run does."""
    lock_path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused while a run holds it exclusively
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return _holder(lock_path)
    except OSError as error:
        if error.errno not in FLOCK_UNSUPPORTED:
            raise
        info = _holder_info(lock_path)  # no flock here: the file itself is the lock
        return None if _stale(info) else _describe(info)
    finally:
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
    flock = _flock_supported(folder)
    if flock:
        fd = _acquire(lock_path)
    else:
        fd = _acquire_exclusive_file(lock_path, command)
        logger.info(
            "The file system of %s has no flock: the output lock is the file %s itself (pid %d on %s); if this "
            "run is killed, the next one on this host clears it (from another host: delete the file).",
            folder, lock_path, os.getpid(), socket.gethostname(),
        )  # fmt: skip
    try:
        if flock:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder_record(command), 0)
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


__all__ = [
    "FLOCK_UNSUPPORTED",
    "LOCK_FILE",
    "OutputLocked",
    "lock_holder",
    "output_lock",
    "output_lock_in_process_zero",
]
