"""vit_ft.utils.lock: one run per output folder, held until the holder ends (however it ends), naming the holder."""

import os
import signal
import subprocess
import sys
import time

import pytest

from vit_ft.utils.lock import LOCK_FILE, OutputLocked, output_lock

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
