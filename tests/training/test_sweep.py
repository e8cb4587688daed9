"""The fine-tune's --sweep (vit_ft.training.sweep): one fine-tune per value, the winner chosen on validation, resumable."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import pytest
import torch

from vit_ft.arguments.recipes import RecipeError
from vit_ft.commands import finetune
from vit_ft.commands.finetune import parse_command
from vit_ft.tools.trained import load_trained
from vit_ft.training import sweep
from vit_ft.training.sweep_values import parse_sweep, sweep_runs
from vit_ft.utils.run_record import RUN_RECORD_FILE, is_finished, read_run_record

from ..conftest import REPO, write_tiny_recipe

# Judged on validation loss, which moves continuously, so that the first value (too small a learning rate to
# change anything) and the second (one that learns) never tie: the choice must go to the second.
SETTINGS = {"num_train_epochs": 1, "metric_for_best_model": "loss", "save_total_limit": 1}
SWEEP = "learning_rate=1e-9,0.003"
FIRST, SECOND = "sweep-learning_rate-1e-9", "sweep-learning_rate-0.003"


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `folder` with its modification time and bytes."""
    return {
        str(path.relative_to(folder)): (path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def run_command(main, *args: str) -> int:
    """A vit-ft command in this process, `main(argv)` as the console script calls it: its exit code. No
    interpreter starts (seconds each); what it prints is pytest's to capture."""
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    return stop.value.code


def run_finetune_here(*args: str, capsys) -> subprocess.CompletedProcess:
    """`vit-ft finetune ARGS` in this process, with what it printed."""
    code = run_command(finetune.main, *args)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    recipe = write_tiny_recipe(tmp, **SETTINGS)
    assert (
        run_command(
            finetune.main, "--recipe", str(recipe), "--sweep", SWEEP, "--output_dir", str(tmp / "out")
        )
        == 0
    )
    return tmp / "out"


# ---------------------------------------------------------------------------------------------------------------
# Parsing and choosing, without training
# ---------------------------------------------------------------------------------------------------------------


def test_parse_sweep_names_and_values():
    assert parse_sweep("learning_rate=0.001, 0.003") == ("learning_rate", ["0.001", "0.003"])
    with pytest.raises(RecipeError, match="did you mean 'learning_rate'"):
        parse_sweep("learnig_rate=0.1")
    with pytest.raises(RecipeError, match="no values"):
        parse_sweep("learning_rate=")
    with pytest.raises(RecipeError, match="empty value"):
        parse_sweep("learning_rate=0.1,,0.2")
    with pytest.raises(RecipeError, match="ARGUMENT=VALUE"):
        parse_sweep("learning_rate")
    with pytest.raises(RecipeError, match="cannot vary output_dir"):
        parse_sweep("output_dir=a,b")


def test_a_value_given_twice_or_also_as_a_flag_is_refused(tmp_path):
    recipe = str(write_tiny_recipe(tmp_path))
    with pytest.raises(RecipeError, match="the same run twice"):
        sweep_runs(["--recipe", recipe], "learning_rate", ["0.001", "1e-3"], tmp_path / "out")
    with pytest.raises(RecipeError, match="both as a flag and in --sweep"):
        sweep_runs(
            ["--recipe", recipe, "--learning_rate", "0.1"], "learning_rate", ["0.001"], tmp_path / "out"
        )


def test_a_run_in_its_own_process_is_the_sweeps_command_with_the_runs_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # so that --push_to_hub parses
    out = tmp_path / "out"
    argv = ["--recipe", str(write_tiny_recipe(tmp_path)), "--output_dir", str(out), "--sweep", SWEEP]
    argv += [
        "--process_per_run",
        "--resume",
        "--overwrite_output_dir",
        "--push_to_hub",
        "--hub_model_id",
        "me/m",
    ]
    command = parse_command(argv)
    (run,) = sweep_runs(list(command.flags), "learning_rate", ["0.003"], out)
    lines, exit_code = [], 0

    def fake_run(line, stdout, **kwargs):
        lines.append(line)
        stdout.write("INFO starting\nerror: the run's own error line.\n\n")
        return subprocess.CompletedProcess(line, exit_code)

    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    log = tmp_path / "run.log"
    sweep._run_as_process("learning_rate", run, "resume", command, log)
    assert lines[0][:5] == [sys.executable, "-m", "vit_ft.commands.finetune", "--recipe", argv[1]]
    assert lines[0][-6:] == [
        "--output_dir", str(out / SECOND), "--resume", "--overwrite_output_dir", "--push_to_hub", "false",
    ] and "--learning_rate=0.003" in lines[0]  # fmt: skip
    # its folder and its resume are the run's own; the sweep alone pushes (its winner)
    assert lines[0].count("--output_dir") == 1 and "--resume_from_checkpoint" not in lines[0]
    exit_code = 3
    with pytest.raises(
        ValueError, match=r"learning_rate=0.003 failed \(exit 3\): error: the run's own error"
    ):
        sweep._run_as_process("learning_rate", run, "start", command, log)
    assert "--resume" not in lines[1]


# ---------------------------------------------------------------------------------------------------------------
# A real sweep, as a user runs it
# ---------------------------------------------------------------------------------------------------------------


def test_sweep_records_every_run_and_chooses_on_validation(finished_sweep):
    out = finished_sweep
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["argument"] == "learning_rate" and summary["metric"] == "eval_loss"
    assert [row["folder"] for row in summary["runs"]] == [FIRST, SECOND]
    for row in summary["runs"]:  # every number is the run's own, as its record says
        recorded = read_run_record(out / row["folder"])
        assert recorded["finished"] is True
        for key in ("eval_loss", "eval_accuracy", "test_loss", "test_accuracy"):
            assert row[key] == pytest.approx(recorded["metrics"][key])
    losses = [row["eval_loss"] for row in summary["runs"]]
    assert losses[0] != losses[1]
    best = min(range(2), key=losses.__getitem__)
    assert summary["chosen"]["folder"] == summary["runs"][best]["folder"] == SECOND
    assert [row["chosen"] for row in summary["runs"]] == [best == 0, best == 1]
    table = (out / "sweep.md").read_text()
    assert "| 1e-9 |" in table and "| 0.003 |" in table and "**yes**" in table


def test_the_winner_is_copied_and_loads(finished_sweep):
    out = finished_sweep
    assert is_finished(out)
    record = read_run_record(out)
    assert record["sweep"]["chosen"]["folder"] == SECOND
    assert record["metrics"] == read_run_record(out / SECOND)["metrics"]
    copied = load_trained(out, device="cpu").model.state_dict()
    winner = load_trained(out / SECOND, device="cpu").model.state_dict()
    loser = load_trained(out / FIRST, device="cpu").model.state_dict()
    assert copied.keys() == winner.keys()
    assert all(torch.equal(copied[key], winner[key]) for key in copied)
    assert not all(torch.equal(copied[key], loser[key]) for key in copied)
    assert not any(path.name.startswith("checkpoint-") for path in out.iterdir())  # those stay in the run


# --sweep value -> words of the one error line; every case runs against the finished sweep, which must not change
BAD = {
    "learnig_rate=0.001,0.003": "did you mean 'learning_rate'",  # unknown argument
    "learning_rate=": "gives no values",  # empty list
    "learning_rate=0.001,fast": "learning_rate=fast",  # a value that does not convert
    "learning_rate=0.003,0": "learning_rate=0.0 must be positive",  # a value that fails validation
}


def test_bad_sweeps_and_a_finished_sweep_are_one_error_line_and_change_nothing(finished_sweep, capsys):
    before = snapshot(finished_sweep)
    recipe = str(finished_sweep.parent / "tiny.yaml")
    commands = {
        **{words: ["--sweep", sweep, "--overwrite_output_dir"] for sweep, words in BAD.items()},
        "holds a finished sweep": ["--sweep", SWEEP],  # a good sweep into a finished one, without overwrite
    }
    for words, args in commands.items():  # each case fails before any data or model loads
        result = run_finetune_here(
            "--recipe", recipe, "--output_dir", str(finished_sweep), *args, capsys=capsys
        )
        lines = error_lines(result)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert len(lines) == 1 and words in lines[0], result.stderr[-3000:]
        if words == "holds a finished sweep":
            assert "--overwrite_output_dir" in lines[0]
    assert snapshot(finished_sweep) == before


@pytest.mark.long
def test_interrupted_sweep_resumes_without_repeating_a_finished_run(tmp_path, finished_sweep, capsys, caplog):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--sweep", SWEEP],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None and not is_finished(out / FIRST):
            time.sleep(0.05)
        assert process.poll() is None, "the sweep ended before it could be interrupted"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert is_finished(out / FIRST) and not (out / "sweep.json").exists()
    first = snapshot(out / FIRST)

    # without --resume the finished run is not silently redone (the killed sweep's lock does not hold it back)
    command = ("--recipe", str(recipe), "--sweep", SWEEP, "--output_dir", str(out))
    again = run_finetune_here(*command, capsys=capsys)
    assert again.returncode == 1 and "--resume" in error_lines(again)[0], again.stderr[-3000:]

    with caplog.at_level(logging.INFO, logger="vit_ft"):
        resumed = run_finetune_here(*command, "--resume", capsys=capsys)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"sweep run 1/2: learning_rate=1e-9 in {out / FIRST} finished before; kept" in caplog.text
    assert snapshot(out / FIRST) == first  # not repeated: every file as the interrupted sweep left it
    summary = json.loads((out / "sweep.json").read_text())
    reference = json.loads((finished_sweep / "sweep.json").read_text())
    assert summary["chosen"] == reference["chosen"]
    for row, expected in zip(summary["runs"], reference["runs"], strict=True):
        assert row["eval_loss"] == pytest.approx(expected["eval_loss"], abs=1e-5)
    assert is_finished(out) and (out / RUN_RECORD_FILE).is_file()

    # --resume of the finished sweep: nothing to resume, nothing rewritten (sweep.json, the winner, the record)
    finished = snapshot(out)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vit_ft"):
        again = run_finetune_here(*command, "--resume", capsys=capsys)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"{out}: the sweep already finished, nothing to resume" in caplog.text
    assert "finished before; kept" not in caplog.text and snapshot(out) == finished


@pytest.mark.long  # a two-process launch of two runs: CI's own step
def test_sweep_under_two_processes(tmp_path):
    """Every process takes part in every run; process 0 alone chooses, copies and writes, once."""
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
        str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true", "--sweep", SWEEP,
    ]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    out = tmp_path / "out"
    assert log.count("INFO vit_ft: Sweep finished") == 1
    for folder in (FIRST, SECOND):
        assert read_run_record(out / folder)["world_size"] == 2
    summary = json.loads((out / "sweep.json").read_text())
    losses = [row["eval_loss"] for row in summary["runs"]]
    assert summary["chosen"]["folder"] == summary["runs"][losses.index(min(losses))]["folder"]
    assert read_run_record(out)["sweep"]["chosen"] == summary["chosen"] and is_finished(out)
