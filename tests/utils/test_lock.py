"""vit_ft.utils.lock: one run per output folder, held until the holder ends (however it ends), naming the holder."""

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_ft.utils.lock import FLOCK_UNSUPPORTED, LOCK_FILE, OutputLocked, output_lock

HOLD = """import sys, time
from vit_ft.utils.lock import output_lock
with output_lock(sys.argv[1], "holder-test"):
    print("held", flush=True)
    time.sleep(120)
"""


def hold_in_another_process(folder) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_holder_is_refused_naming_the_first_until_it_dies(tmp_path):
    process = hold_in_another_process(tmp_path / "out")
    try:
        with (
            pytest.raises(
                OutputLocked, match=rf"out is in use by another run \(pid {process.pid} on .*holder-test"
            ),
            output_lock(tmp_path / "out"),
        ):
            pass
    finally:
        os.kill(process.pid, signal.SIGKILL)  # a crash: the kernel releases the lock, the file stays
        process.wait()
    assert (tmp_path / "out" / LOCK_FILE).exists()
    with output_lock(tmp_path / "out", "second") as lock_file:
        assert '"command": "second"' in lock_file.read_text()
        assert f'"pid": {os.getpid()}' in lock_file.read_text()
    assert not (tmp_path / "out" / LOCK_FILE).exists()  # removed on a clean exit


def test_the_lock_is_per_open_file_even_in_one_process(tmp_path):
    with output_lock(tmp_path), pytest.raises(OutputLocked), output_lock(tmp_path):
        pass
    with output_lock(tmp_path):  # released and taken again
        pass


def test_a_holder_killed_by_sigterm_frees_the_folder_at_once(tmp_path):
    process = hold_in_another_process(tmp_path)
    process.terminate()  # the context manager does not run: the kernel frees the lock, the stale file stays
    process.wait()
    start = time.monotonic()
    with (
        output_lock(tmp_path),
        pytest.raises(OutputLocked, match=f"pid {os.getpid()} on"),
        output_lock(tmp_path),
    ):
        pass
    assert time.monotonic() - start < 5


def test_a_lock_on_a_removed_file_is_not_kept(tmp_path, monkeypatch):
    """A run that opened the lock file just before its holder removed it must not lock that orphan while a
    third run holds the new file: it opens the path again and meets the new holder."""
    stale = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    (tmp_path / LOCK_FILE).unlink()  # what the holder's clean exit does
    real_open, opened = os.open, []

    def open_stale_first(path, *args):
        opened.append(path)
        return stale if len(opened) == 1 else real_open(path, *args)

    with output_lock(tmp_path, "third"):
        monkeypatch.setattr(os, "open", open_stale_first)
        with pytest.raises(OutputLocked, match="third"), output_lock(tmp_path):
            pass
    assert len(opened) == 2


def no_flock(monkeypatch, code=errno.ENOLCK):
    """The file system of Lustre mounted without -o flock: every fcntl.flock call fails."""

    def flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", flock)


def holder_record(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("code", FLOCK_UNSUPPORTED)
def test_without_flock_the_lock_file_itself_is_the_lock_and_a_line_says_so(tmp_path, monkeypatch, caplog, code):
    no_flock(monkeypatch, code)
    with caplog.at_level(logging.INFO, logger="vit_ft"), output_lock(tmp_path / "out", "first") as lock_file:
        record = holder_record(lock_file)
        assert (record["pid"], record["host"], record["command"]) == (os.getpid(), socket.gethostname(), "first")
        refusal = rf"pid {os.getpid()} on {socket.gethostname()}, first .*delete {lock_file}"
        with pytest.raises(OutputLocked, match=refusal), output_lock(tmp_path / "out", "second"):
            pass
        assert holder_record(lock_file)["command"] == "first"  # the refused run left the holder's file alone
    assert not (tmp_path / "out" / LOCK_FILE).exists()  # released: removed
    lines = [r.getMessage() for r in caplog.records if "has no flock" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path / "out" / LOCK_FILE) in lines[0]
    with output_lock(tmp_path / "out", "third") as lock_file:  # free again
        assert holder_record(lock_file)["command"] == "third"


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_without_flock_a_lock_left_by_a_dead_run_on_this_host_is_cleared_with_a_line(tmp_path, monkeypatch, caplog):
    no_flock(monkeypatch)
    pid = dead_pid()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "command": "killed"}))
    with caplog.at_level(logging.INFO, logger="vit_ft"), output_lock(tmp_path, "next") as lock_file:
        assert holder_record(lock_file)["pid"] == os.getpid()
    stale = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert len(stale) == 1 and f"pid {pid} on {socket.gethostname()}, killed" in stale[0]
    assert not list(tmp_path.iterdir())  # nothing left aside


@pytest.mark.parametrize(
    "holder",
    [
        {"pid": os.getpid(), "host": socket.gethostname(), "command": "alive here"},  # a live pid
        {"pid": 2**22 + 7, "host": "another-node", "command": "elsewhere"},  # cannot be checked from here
    ],
)
def test_without_flock_a_live_or_remote_holder_is_kept_and_the_refusal_says_how_to_clear_it(
    tmp_path, monkeypatch, holder
):
    no_flock(monkeypatch)
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    message = rf"pid {holder['pid']} on {holder['host']}, {holder['command']}.*delete {tmp_path / LOCK_FILE}"
    with pytest.raises(OutputLocked, match=message), output_lock(tmp_path):
        pass
    assert holder_record(tmp_path / LOCK_FILE) == holder


def test_a_fresh_lock_made_while_a_stale_one_is_cleared_is_put_back(tmp_path, monkeypatch):
    """Two runs meet the same stale file: the second renames aside the fresh lock the first has just made
    in its place, sees it is not the stale one, and puts it back."""
    no_flock(monkeypatch)
    lock_path = tmp_path / LOCK_FILE
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "command": "killed"}
    fresh = {"pid": os.getpid(), "host": socket.gethostname(), "command": "first"}
    lock_path.write_text(json.dumps(stale))
    real_rename = os.rename

    def first_run_wins_meanwhile(source, target):
        Path(source).write_text(json.dumps(fresh))  # the first run cleared the stale file and made its own
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", first_run_wins_meanwhile)
    with pytest.raises(OutputLocked, match="first"), output_lock(tmp_path, "second"):
        pass
    assert holder_record(lock_path) == fresh and sorted(tmp_path.iterdir()) == [lock_path]
