"""scripts/seeds.py: the same fine-tune under several seeds, one process each, summarised."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from vit_ft.training.seeds import parse_seeds, seed_commands
from vit_ft.utils.run_record import read_run_record, recorded_seed

from ..conftest import run_repo_script, write_tiny_recipe


def run_seeds_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_repo_script("seeds.py", *args, cwd=cwd)


def test_each_seed_is_its_own_run_and_the_summary_is_theirs(tmp_path):
    recipe = write_tiny_recipe(tmp_path, num_train_epochs=1)
    out = tmp_path / "seeds"
    result = run_seeds_script(
        "--recipe", str(recipe), "--seeds", "3,5", "--output_dir", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "seeds.json").read_text())
    assert [run["seed"] for run in summary["runs"]] == [3, 5]
    accuracies = []
    for run in summary["runs"]:
        run_dir = out / f"seed-{run['seed']}"
        assert recorded_seed(read_run_record(run_dir)) == run["seed"]  # the flag reached the fine-tune
        test_accuracy = json.loads((run_dir / "all_results.json").read_text())["test_accuracy"]
        assert run["test_accuracy"] == test_accuracy
        assert run["seconds"] > 0 and (out / f"seed-{run['seed']}.log").stat().st_size > 0
        accuracies.append(test_accuracy)
    assert summary["mean"] == statistics.fmean(accuracies)
    assert (summary["min"], summary["max"]) == (min(accuracies), max(accuracies))
    assert f"{100 * summary['mean']:.2f}%" in result.stdout
    assert (out / "seeds.md").read_text() in result.stdout


def test_a_recipe_that_pretrains_gets_one_checkpoint_per_seed_unless_one_is_named(tmp_path):
    commands = seed_commands(["--recipe", "digits"], [0, 1], tmp_path)
    for seed, command in commands.items():
        assert command[command.index("--seed") + 1] == str(seed)
        assert command[command.index("--output_dir") + 1] == str(tmp_path / f"seed-{seed}")
        assert command[command.index("--model_name_or_path") + 1] == str(tmp_path / f"pretrained-seed-{seed}")
    named = seed_commands(["--recipe", "digits", "--model_name_or_path", "ckpt"], [0], tmp_path)[0]
    assert named.count("--model_name_or_path") == 1 and "ckpt" in named
    # pre-training turned off: every seed starts from the recipe's checkpoint
    off = seed_commands(["--recipe", "digits", "--pretrain_if_missing", "none"], [0], tmp_path)[0]
    assert "--model_name_or_path" not in off


def test_mistakes_are_one_line_before_any_run(tmp_path):
    recipe = write_tiny_recipe(tmp_path)
    out = tmp_path / "seeds"
    for extra, expected in [
        (["--seed", "4"], "--seed is set by the seeds loop"),
        (["--seeds", "0,0"], "distinct"),
        (["--seeds", "zero"], "comma-separated integers"),
        (["--learning_rat", "0.1"], "learning_rat"),
    ]:
        result = run_seeds_script("--recipe", str(recipe), "--output_dir", str(out), *extra, cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, result.stderr
        assert lines[0].startswith("error:") and expected in lines[0]
        assert not out.exists()  # nothing ran, nothing written
    assert parse_seeds("0, 1,2") == [0, 1, 2]
