"""`vit-ft bench` end to end through the local Hub stand-in: two VTAB-shaped tasks (clip-benchmark's webdataset
layout) x two methods, a tiny ViT, two steps a cell; then a rerun after one cell was killed midway."""

from __future__ import annotations

import json
import subprocess
import sys

import datasets
import pytest

from vit_ft.bench.run import METHODS
from vit_ft.utils.run_record import mark_unfinished, read_run_record

from ..fake_hub import FakeHub
from .stand_in import SIZE, tiny_backbone, vtab_files

TASKS = {"cifar100": ("clip-benchmark/wds_vtab-cifar100", 3), "dsprites_loc": ("clip-benchmark/wds_vtab-dsprites_label_x_position", 4)}  # fmt: skip
CELLS = [(task, method) for task in TASKS for method in ("lora", "linear")]
TINY = ["--max_steps", "2", "--image_size", str(SIZE), "--per_device_train_batch_size", "8", "--global_batch_size", "8",
        "--per_device_eval_batch_size", "16", "--dataloader_num_workers", "0", "--use_cpu", "true", "--bf16", "false"]  # fmt: skip


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    backbone = tiny_backbone(tmp / "backbone")
    files = {task: vtab_files(24, 12, classes, seed) for seed, (task, (_, classes)) in enumerate(TASKS.items())}
    command = [sys.executable, "-m", "vit_ft", "bench", "vtab1k", "--model", str(backbone), "--output_dir",
               str(tmp / "out"), "--methods", "lora,linear", "--tasks", ",".join(TASKS), "--train_size", "16",
               "--validation_size", "8", "--", *TINY]  # fmt: skip
    with FakeHub() as hub:
        commits = {task: hub.add_repo(hub_id, files[task], repo_type="dataset") for task, (hub_id, _) in TASKS.items()}
        first = subprocess.run(command, env=hub.env(tmp), cwd=tmp, capture_output=True, text=True, timeout=900)
        out = tmp / "out"
        before = {cell: out.joinpath("results", cell[0], f"{cell[1]}-seed0.json").stat().st_mtime_ns for cell in CELLS}
        # cifar100 x lora killed midway: no result file, its run folder unfinished
        out.joinpath("results", "cifar100", "lora-seed0.json").unlink()
        mark_unfinished(out / "runs" / "cifar100" / "lora-seed0")
        second = subprocess.run(command, env=hub.env(tmp), cwd=tmp, capture_output=True, text=True, timeout=900)
    yield {"first": first, "second": second, "out": out, "commits": commits, "files": files, "tmp": tmp, "before": before}


@pytest.mark.long
def test_bench_writes_each_cell_and_the_table(bench_run):
    first, out = bench_run["first"], bench_run["out"]
    assert first.returncode == 0, first.stderr[-4000:]
    lock = json.loads((out / "datasets.lock.json").read_text())
    assert {task: entry["revision"] for task, entry in lock.items()} == bench_run["commits"]  # the Hub's commits
    summary = json.loads((out / "results.json").read_text())
    assert summary["seeds"] == [0] and summary["environment"]["versions"]["transformers"]
    for task, method in CELLS:
        result = json.loads((out / "results" / task / f"{method}-seed0.json").read_text())
        record = read_run_record(out / "runs" / task / f"{method}-seed0")
        assert result["test_accuracy"] == record["metrics"]["test_accuracy"]  # the cell's own fine-tune
        assert summary["summary"][method]["tasks"][task]["mean"] == pytest.approx(100 * result["test_accuracy"])
    table = (out / "results.md").read_text()
    assert "| lora |" in table and "| lora (published) |" in table and "72.25" in table
    assert set(METHODS) >= {"lora", "linear"}


@pytest.mark.long
def test_bench_draws_the_first_800_and_next_200_of_the_hubs_training_split(bench_run):
    tmp = bench_run["tmp"]
    shards = tmp / "shards"
    shards.mkdir()
    (shards / "train.tar").write_bytes(bench_run["files"]["cifar100"]["train/0.tar"])
    reference = datasets.load_dataset("webdataset", data_files={"train": str(shards / "train.tar")}, split="train")
    prepared = datasets.load_from_disk(str(bench_run["out"] / "data" / "cifar100"))
    assert (len(prepared["train"]), len(prepared["validation"]), len(prepared["test"])) == (16, 8, 12)
    assert prepared["train"]["label"] == reference["cls"][:16] and prepared["validation"]["label"] == reference["cls"][16:24]
    assert prepared["train"][3]["image"].tobytes() == reference[3]["webp"].tobytes()


@pytest.mark.long
def test_a_rerun_redoes_only_the_cell_without_its_result(bench_run):
    second, out, before = bench_run["second"], bench_run["out"], bench_run["before"]
    assert second.returncode == 0, second.stderr[-4000:]
    assert "1 cells to run (3 already done)" in second.stdout + second.stderr
    for cell in CELLS:
        after = out.joinpath("results", cell[0], f"{cell[1]}-seed0.json").stat().st_mtime_ns
        assert (after != before[cell]) == (cell == ("cifar100", "lora")), cell
    assert read_run_record(out / "runs" / "cifar100" / "lora-seed0")["finished"]
