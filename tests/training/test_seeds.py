"""A sweep over seed (vit_ft.training.seeds): the same fine-tune under several seeds, summarised, no winner
copied; `vit-ft seeds` / scripts/seeds.py is that sweep with one process per run."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path

import huggingface_hub
import pytest

from vit_ft.commands import finetune, seeds
from vit_ft.training import sweep
from vit_ft.training.seeds import parse_seeds, to_markdown
from vit_ft.training.sweep_values import sweep_runs
from vit_ft.utils.output_dir import written_by
from vit_ft.utils.run_record import RUN_RECORD_FILE, read_run_record, recorded_seed

from ..conftest import write_tiny_recipe
from .test_sweep import error_lines, run_command

SEEDS = "3,5"


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory) -> Path:
    """`vit-ft finetune --sweep seed=3,5`, in this process: the output folder."""
    tmp = tmp_path_factory.mktemp("seed_sweep")
    recipe = write_tiny_recipe(tmp, num_train_epochs=1)
    assert run_command(finetune.main, "--recipe", str(recipe), "--sweep", f"seed={SEEDS}") == 0
    return tmp / "out"


def check_summary(out: Path, kept: tuple[int, ...] = ()) -> dict:
    """seeds.json is the runs' own numbers: each seed's test accuracy, their mean, lowest and highest, and the wall
    time of each seed that ran (none for one a resumed sweep `kept`)."""
    summary = json.loads((out / "seeds.json").read_text())
    assert [run["seed"] for run in summary["runs"]] == [3, 5]
    accuracies = []
    for run in summary["runs"]:
        run_dir = out / f"seed-{run['seed']}"
        assert recorded_seed(read_run_record(run_dir)) == run["seed"]  # the seed reached the fine-tune
        test_accuracy = json.loads((run_dir / "all_results.json").read_text())["test_accuracy"]
        assert run["test_accuracy"] == test_accuracy
        assert run["seconds"] is None if run["seed"] in kept else run["seconds"] > 0
        assert (out / f"seed-{run['seed']}.log").stat().st_size > 0
        accuracies.append(test_accuracy)
    assert summary["metric"] == "test_accuracy"
    assert summary["mean"] == statistics.fmean(accuracies)
    assert (summary["min"], summary["max"]) == (min(accuracies), max(accuracies))
    assert f"{100 * summary['mean']:.2f}%" in (out / "seeds.md").read_text()
    return summary


def test_a_seed_sweep_summarises_its_seeds_and_copies_no_winner(seed_sweep):
    summary = check_summary(seed_sweep)
    assert summary["command"][:3] == ["vit-ft", "finetune", "--recipe"]
    assert (seed_sweep / "seeds.md").read_text() == to_markdown(summary, process_per_run=False)
    assert "in one process" in (seed_sweep / "seeds.md").read_text()
    for seed in (3, 5):  # each seed's log is its own run's, not the other's
        log = (seed_sweep / f"seed-{seed}.log").read_text()
        assert f"In {seed_sweep / f'seed-{seed}'}: " in log and f"seed-{8 - seed}" not in log
    # no winner: no model, run record or sweep table in OUTPUT, only the seeds' folders, logs and summary
    assert sorted(path.name for path in seed_sweep.iterdir() if not path.name.startswith(".")) == [
        "seed-3", "seed-3.log", "seed-5", "seed-5.log", "seeds.json", "seeds.md",
    ]  # fmt: skip
    assert not (seed_sweep / RUN_RECORD_FILE).exists()
    assert written_by(seed_sweep, "finetune")  # the sweep's names in OUTPUT claimed (a rerun is not refused)


@pytest.mark.long
def test_the_seeds_command_runs_each_seed_in_its_own_process(tmp_path, seed_sweep, monkeypatch, capsys):
    """`vit-ft seeds --resume` over the in-process sweep's seed 3: seed 5 runs as a command of its own, and gives
    the numbers it gave in the sweep's process. One process start, not two: the suite's time."""
    calls, real_run = [], subprocess.run

    def recorded_run(line, **kwargs):
        calls.append(line)
        return real_run(line, **kwargs)

    def in_process(*args, **kwargs):
        raise AssertionError("a run of --process_per_run ran in the sweep's process")

    monkeypatch.setattr(sweep.subprocess, "run", recorded_run)
    monkeypatch.setattr(sweep, "run_finetune", in_process)
    out = tmp_path / "seeds"
    shutil.copytree(seed_sweep / "seed-3", out / "seed-3")
    shutil.copy(seed_sweep / "seed-3.log", out / "seed-3.log")
    recipe = str(seed_sweep.parent / "tiny.yaml")
    code = run_command(seeds.main, "--recipe", recipe, "--seeds", SEEDS, "--output_dir", str(out), "--resume")
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    ((python, *line),) = calls  # one command, for the seed that was not finished: a process of its own
    assert line[:4] == ["-m", "vit_ft.commands.finetune", "--recipe", recipe] and "--seed=5" in line
    assert line[line.index("--output_dir") + 1] == str(out / "seed-5") and line.count("--output_dir") == 1
    assert "INFO" in (out / "seed-5.log").read_text()  # the command's own output
    summary = check_summary(out, kept=(3,))
    assert (out / "seeds.md").read_text() in captured.out and "one process per seed" in captured.out
    assert "| 3 | " in captured.out and "| - |" in captured.out  # the kept seed's time is not this loop's
    in_one = json.loads((seed_sweep / "seeds.json").read_text())  # the same fine-tunes: the same numbers
    assert [run["test_accuracy"] for run in summary["runs"]] == [
        run["test_accuracy"] for run in in_one["runs"]
    ]


def test_a_recipe_that_pretrains_gets_one_checkpoint_per_seed_unless_one_is_named(tmp_path):
    for run, seed in zip(
        sweep_runs(["--recipe", "digits"], "seed", ["0", "1"], tmp_path), (0, 1), strict=True
    ):
        model_args, _, training_args = run.plan.arguments
        assert training_args.seed == seed and run.folder == tmp_path / f"seed-{seed}"
        assert training_args.output_dir == str(tmp_path / f"seed-{seed}")
        assert model_args.model_name_or_path == str(tmp_path / f"pretrained-seed-{seed}")
        # the seed's checkpoint named, and its pre-training with it (a named checkpoint alone must exist)
        assert run.flags[-4:] == ("--model_name_or_path", str(tmp_path / f"pretrained-seed-{seed}"),
                                  "--pretrain_if_missing", "digits")  # fmt: skip
        assert model_args.pretrain_if_missing == "digits"
    (named,) = sweep_runs(["--recipe", "digits", "--model_name_or_path", "ckpt"], "seed", ["0"], tmp_path)
    assert named.plan.model_args.model_name_or_path == "ckpt" and "--model_name_or_path" not in named.flags
    assert named.plan.model_args.pretrain_if_missing is None  # the recipe's pre-training builds its own checkpoint only
    # pre-training turned off: every seed starts from the recipe's checkpoint
    (off,) = sweep_runs(["--recipe", "digits", "--pretrain_if_missing", "none"], "seed", ["0"], tmp_path)
    assert "--model_name_or_path" not in off.flags
    # any other sweep shares the recipe's pre-training
    (other,) = sweep_runs(["--recipe", "digits"], "learning_rate", ["0.01"], tmp_path)
    assert "pretrained-seed" not in other.plan.model_args.model_name_or_path


def test_mistakes_are_one_line_before_any_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # so that --push_to_hub parses
    recipe = str(write_tiny_recipe(tmp_path))
    out = tmp_path / "seeds"
    capsys.readouterr()  # writing the recipe's checkpoint shows a progress bar
    seeds_cases = [
        (["--seed", "4"], "--seed is set by the seeds loop"),
        (["--process_per_run"], "--process_per_run is set by the seeds loop"),
        (["--seeds", "0,0"], "distinct"),
        (["--seeds", "zero"], "comma-separated integers"),
        (["--learning_rat", "0.1"], "learning_rat"),
    ]
    finetune_cases = [
        (["--process_per_run"], "--process_per_run runs each run of a --sweep"),
        (["--sweep", "seed=1,2", "--push_to_hub", "true"], "nothing to push"),
        (["--sweep", "seed=1,01"], "the same run twice"),
    ]
    cases = [(seeds.main, ["--output_dir", str(out), *extra], words) for extra, words in seeds_cases]
    cases += [(finetune.main, ["--output_dir", str(out), *extra], words) for extra, words in finetune_cases]
    for main, extra, expected in cases:
        code = run_command(main, "--recipe", recipe, *extra)
        result = subprocess.CompletedProcess([], code, "", capsys.readouterr().err)
        lines = result.stderr.strip().splitlines()
        assert code == 1 and len(lines) == 1 and error_lines(result) == lines, result.stderr
        assert expected in lines[0], lines[0]
        assert not out.exists()  # nothing ran, nothing written
    assert parse_seeds("0, 1,2") == [0, 1, 2]
