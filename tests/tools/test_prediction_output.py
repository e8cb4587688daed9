"""vit_ft.tools.predict.output: predict replaces only its own files (or any with --overwrite), says a full
disk in one line, and leaves no hidden `.part` file whatever fails. The full disk is met twice: injected at the
write (everywhere), and for real on a small tmpfs through scripts/predict.py (where this machine may mount one)."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_ft.tools.predict.output import (
    PREDICTION_COLUMNS,
    Prediction,
    PredictionWriter,
    mark_figure,
    read_predictions,
    written_by_predict,
)
from vit_ft.tools.predict.run import run_prediction

from ..cli_runner import run_script
from ..conftest import REPO

HEADER = ",".join(PREDICTION_COLUMNS) + "\n"
JSONL_ROW = '{"path": "a.png", "label": "cat", "score": 0.9, "top_k_labels": ["cat"], "top_k_scores": [0.9], "error": null}\n'


def png_bytes(seed: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


@pytest.mark.parametrize(
    "name, content, ours",
    [
        ("preds.csv", HEADER.encode() + b"a.png,cat,0.9,[],[],\n", True),
        ("preds.csv", HEADER.replace("\n", "\r\n").encode(), True),
        ("preds.jsonl", JSONL_ROW.encode(), True),
        ("preds.csv", b"", True),  # empty: nothing to lose
        ("preds.csv", b"path,label\nyesterday.png,cat\n", False),
        ("preds.csv", b"path,label,score,top_k_labels,top_k_scores,error,mine\n", False),
        ("preds.jsonl", b'{"path": "a.png"}\n', False),
        ("preds.jsonl", b"[1, 2]\n", False),
        ("results.png", png_bytes(), False),
        ("results.png", mark_figure(png_bytes()), True),
        ("results.png", b"yesterday's figure", False),
    ],
)
def test_only_files_predict_wrote_count_as_its_own(tmp_path, name, content, ours):
    path = tmp_path / name
    path.write_bytes(content)
    assert written_by_predict(path) is ours


def test_the_mark_keeps_a_valid_png():
    marked = mark_figure(png_bytes(1))
    with Image.open(io.BytesIO(marked)) as image:
        image.verify()  # checks every chunk's CRC
    with Image.open(io.BytesIO(marked)) as image:
        assert image.info.get("vit_ft") == "predict"
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png_bytes(1)))))


class FullDisk(io.TextIOBase):
    """A file on a full disk: with `at_close` the writes fit in the buffer and the flush that closing does
    fails (a buffered file's usual way to meet a full disk), else the first write fails."""

    def __init__(self, real: io.TextIOBase, at_close: bool):
        self.real, self.at_close = real, at_close

    def write(self, text: str) -> int:
        if not self.at_close:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(text)

    def close(self) -> None:
        self.real.close()
        super().close()
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("at_close", [False, True], ids=["at a write", "at close"])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_full_disk_is_one_line_and_leaves_no_part_file(tmp_path, at_close, suffix):
    old = tmp_path / f"preds{suffix}"
    old.write_text(HEADER)

    class FullWriter(PredictionWriter):
        def __init__(self, path):
            super().__init__(path)
            self._file = FullDisk(self._file, at_close)
            if self._csv is not None:
                self._csv = type(self._csv)(self._file, fieldnames=PREDICTION_COLUMNS)

    with pytest.raises(OSError) as raised, FullWriter(old) as writer:
        for i in range(3):
            writer.write(Prediction(f"{i}.png", ["cat"], [0.5]))
    message = str(raised.value)
    assert message.startswith(f"no space left on the disk holding {old} (") and "\n" not in message, message
    assert (
        "free there); an existing one is unchanged. Free some space, or pass --output on another disk"
        in message
    )
    assert old.read_text() == HEADER
    assert sorted(p.name for p in tmp_path.iterdir()) == [old.name]  # no hidden .part file


@pytest.fixture
def photos(tmp_path) -> Path:
    (tmp_path / "photos").mkdir()
    for name in ("a", "b"):
        Image.open(io.BytesIO(png_bytes(ord(name)))).resize((20, 20)).save(
            tmp_path / "photos" / f"{name}.png"
        )
    return tmp_path / "photos"


def test_a_rerun_replaces_its_own_files_and_only_overwrite_replaces_others(
    hf_classifier_dir, photos, tmp_path
):
    output, figure = tmp_path / "preds.csv", tmp_path / "preds.png"
    run_prediction(hf_classifier_dir, [photos], output, progress=False)
    assert written_by_predict(output) and written_by_predict(figure)
    first = output.read_bytes()
    output.write_bytes(first + b"\n")  # touched, still predict's (its header row)
    run_prediction(hf_classifier_dir, [photos], output, progress=False)  # the rerun replaces both
    assert output.read_bytes() == first
    figure.write_bytes(png_bytes(3))  # someone's own image
    with pytest.raises(
        FileExistsError, match=r"preds.png exists and was not written by predict; pass --overwrite"
    ):
        run_prediction(hf_classifier_dir, [photos], output, progress=False)
    assert figure.read_bytes() == png_bytes(3) and output.read_bytes() == first
    run_prediction(hf_classifier_dir, [photos], output, progress=False, overwrite=True)
    assert written_by_predict(figure)


def test_an_output_name_as_long_as_the_file_system_allows_is_written(hf_classifier_dir, photos, tmp_path):
    """The hidden temporary names are built from the output's name: they are shortened to fit too."""
    output = tmp_path / (
        "é" * 125 + ".csv"
    )  # 254 bytes: allowed, but not with `.` and `.XXXXXXXX.part` added
    run_prediction(hf_classifier_dir, [photos], output, progress=False)
    assert len(read_predictions(output)) == 2 and written_by_predict(output.with_suffix(".png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["photos", output.name, output.stem + ".png"])


def test_sigterm_mid_run_keeps_the_old_output_and_leaves_no_part_file(hf_classifier_dir, tmp_path):
    """kill (SIGTERM, what Slurm and Kubernetes send) while rows are written: the Ctrl-C line, exit 130."""
    many = tmp_path / "many"
    many.mkdir()
    image = Image.open(io.BytesIO(png_bytes(7))).resize((16, 16))
    for i in range(400):
        image.save(many / f"{i:03d}.png")
    output = tmp_path / "preds.csv"
    output.write_text(HEADER)
    run = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/predict.py"), "--model", hf_classifier_dir, str(many),
         "--output", str(output), "--batch_size", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(".preds.csv.*.part")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted.") and "Traceback" not in stderr
    assert output.read_text() == HEADER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many", "preds.csv"]


# ---------------------------------------------------------------------------------------------------------
# A real full disk: a tmpfs of 64 kB, filled up to `free` pages, under scripts/predict.py
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 64 kB tmpfs mounted at tmp_path/disk, unmounted afterwards; skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here (needs root in a container allowed to mount): {mounted.stderr.strip()}"
        )
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


def fill(disk: Path, free_pages: int) -> None:
    """Fill `disk` with one file, leaving `free_pages` pages of 4 kB."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    size = (disk / "filler").stat().st_size
    os.truncate(disk / "filler", size - 4096 * free_pages - size % 4096)


# free pages -> the file the error line names, and which files the run may change
FULL_DISK = {
    "rows": (0, "preds.csv (", "--output"),
    "figure": (1, "preds.png (", "--figure"),  # the rows fit in a page, the figure does not
}


@pytest.mark.parametrize("case", list(FULL_DISK))
def test_predict_on_a_full_disk_is_one_line_and_keeps_every_file(
    small_disk, hf_classifier_dir, photos, case, capfd
):
    free_pages, names, flag = FULL_DISK[case]
    (small_disk / "preds.csv").write_text(HEADER)  # an earlier run's output and figure
    (small_disk / "preds.png").write_bytes(mark_figure(png_bytes(5)))
    fill(small_disk, free_pages)
    before = {p.name: p.read_bytes() for p in small_disk.iterdir()}
    args = ["--model", hf_classifier_dir, photos, "--output", small_disk / "preds.csv"]
    # in this process (the SIGTERM test above needs a process of its own, this one does not)
    result = run_script("scripts/predict.py", args, capfd, cwd=Path.cwd(), env={"HF_HUB_OFFLINE": "1"})
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith(f"error: no space left on the disk holding {small_disk}/{names}"), last
    assert f"Free some space, or pass {flag} on another disk." in last, last
    after = {p.name: p.read_bytes() for p in small_disk.iterdir()}
    assert sorted(after) == sorted(before)  # no hidden .part file
    changed = {name for name in after if after[name] != before[name]}
    assert changed == (set() if case == "rows" else {"preds.csv"})  # complete rows replace the old ones
    assert written_by_predict(small_disk / "preds.csv")
