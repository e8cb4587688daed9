"""Each command that writes a folder (export, evaluate, inspect; few-shot's in
tests/tools/fewshot/test_run.py), run as a user runs it, in a folder that already holds the user's files and
the command's earlier ones: the user's files keep their bytes and mtime, the command's are replaced, and its
earlier files it does not write again are removed (`utils.output_dir.OutputFiles`; the rule's cases are in
tests/utils/test_output_dir.py). One real process per command: the files on disk after it ends are the point."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vit_ft.tools.evaluate.run import EVALUATION_FILES
from vit_ft.tools.export.onnx import EXPORT_FILES
from vit_ft.tools.export.onnx_runtime import INT8_FILE, ONNX_FILE
from vit_ft.tools.inspect.run import INSPECTION_FILES
from vit_ft.utils.output_dir import OUTPUT_RECORD, OutputFiles, record_outputs, written_by

from ..conftest import run_repo_script

OLD = 1_000_000_000.0  # a year long gone: the mtime the user's files must keep


def user_files(folder: Path) -> dict[Path, tuple[bytes, float]]:
    """The user's files beside the output, with subfolder and hidden file: {path: (bytes, mtime)}."""
    files = {
        folder / "notes.txt": b"my notes",
        folder / "README.md": b"# my results\n",
        folder / "runs" / "keep.csv": b"a,b\n1,2\n",
        folder / ".hidden": b"mine too",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (OLD, OLD))
    return {path: (data, OLD) for path, data in files.items()}


def earlier_run(folder: Path, files: OutputFiles, written: list[str], stale: str) -> dict[str, bytes]:
    """The command's files of an earlier run (as its record says); this run does not write `stale` again."""
    earlier = {name: f"earlier {name}".encode() for name in [*written, stale]}
    for name, data in earlier.items():
        assert name in files.names
        (folder / name).write_bytes(data)
    record_outputs(folder, files.command, earlier)
    return earlier


def check_folder(
    folder: Path, files: OutputFiles, users: dict, earlier: dict[str, bytes], stale: str, result
) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    for path, (data, mtime) in users.items():
        assert path.read_bytes() == data and path.stat().st_mtime == mtime, path
    for name, data in earlier.items():
        if name == stale:
            assert not (folder / name).exists(), f"{name} of the earlier run is left beside the new files"
        else:
            assert (folder / name).read_bytes() != data, f"{name} was not replaced"
    new = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {
        p.relative_to(folder).as_posix() for p in users
    }
    assert new - {OUTPUT_RECORD} == written_by(folder, files.command) and new <= {*files.names, OUTPUT_RECORD}
    assert not [p for p in folder.iterdir() if p.name.endswith(".part")]  # no staging folder left


@pytest.mark.long
def test_export_overwrite_keeps_the_users_files(tiny_finetuned_dir, tmp_path):
    folder = tmp_path / "digits-onnx"
    users = user_files(folder)
    earlier = earlier_run(folder, EXPORT_FILES, [ONNX_FILE, "config.json"], stale=INT8_FILE)
    args = ["--model", str(tiny_finetuned_dir), "--output_dir", str(folder), "--overwrite"]  # fp32 only
    result = run_repo_script("export.py", *args, cwd=tmp_path)
    check_folder(folder, EXPORT_FILES, users, earlier, INT8_FILE, result)
    onnx = pytest.importorskip("onnx")
    assert [i.name for i in onnx.load(str(folder / ONNX_FILE)).graph.input] == ["pixel_values"]
    assert "id2label" in json.loads((folder / "config.json").read_text())


@pytest.mark.slow
def test_evaluate_keeps_the_users_files(tiny_finetuned_dir, tmp_path):
    folder = tmp_path / "report"
    users = user_files(folder)
    earlier = earlier_run(folder, EVALUATION_FILES, ["report.md", "metrics.json"], stale="pr_curves.png")
    args = ["--model", str(tiny_finetuned_dir), "--output_dir", str(folder), "--max_samples", "8"]
    result = run_repo_script("evaluate_model.py", *args, cwd=tmp_path)
    check_folder(folder, EVALUATION_FILES, users, earlier, "pr_curves.png", result)
    assert (folder / "report.md").read_text().startswith("# Evaluation of")
    assert json.loads((folder / "metrics.json").read_text())["num_images"] == 8


@pytest.mark.slow
def test_inspect_keeps_the_users_files(tiny_finetuned_dir, tmp_path):
    folder = tmp_path / "figures"
    users = user_files(folder)
    earlier = earlier_run(folder, INSPECTION_FILES, ["inspection.json"], stale="attention_rollout.png")
    args = ["--model", str(tiny_finetuned_dir), "--output_dir", str(folder), "--num_images", "4"]
    result = run_repo_script("inspect_model.py", *args, cwd=tmp_path)
    check_folder(folder, INSPECTION_FILES, users, earlier, "attention_rollout.png", result)
    assert json.loads((folder / "inspection.json").read_text())["rollout"] == []
