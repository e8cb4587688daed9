"""The same fine-tune under several seeds, each a fresh command: how much of a recipe's accuracy is the recipe
and how much is one lucky seed.

    vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/digits-seeds

Each seed runs `python -m vit_ft.commands.finetune <the other flags> --seed N --output_dir OUTPUT/seed-N` (the
fine-tune command, `vit-ft finetune`) in its own process, as a user would type it, so its wall time includes the start-up and, for a recipe with a
built-in pre-training (`pretrain_if_missing`), that pre-training too: each seed pre-trains its own checkpoint in
OUTPUT/pretrained-seed-N unless `--model_name_or_path` is given. Each run's output goes to OUTPUT/seed-N.log.
OUTPUT/seeds.md (the table, also printed) and seeds.json list every seed's test accuracy (validation accuracy
when the recipe has no test split) and wall time, with their mean, lowest and highest.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..utils.files import write_text_atomically
from ..utils.lock import output_lock
from .recipes import given_as_flag, parse_args

logger = logging.getLogger("vit_ft")

SEEDS_JSON = "seeds.json"
SEEDS_MD = "seeds.md"
FINETUNE_MODULE = "vit_ft.commands.finetune"  # run as `python -m`: the installed package, wherever it is
# Flags the loop sets for every seed itself; passing one would make the runs collide or not vary.
OWNED_FLAGS = ("seed", "output_dir", "sweep", "resume", "overwrite_output_dir")


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; at least one seed, no repeats."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers such as 0,1,2, got {text!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds takes distinct comma-separated integers such as 0,1,2, got {text!r}.")
    return seeds


def seed_commands(argv: list[str], seeds: list[int], output_dir: Path) -> dict[int, list[str]]:
    """The fine-tune command of each seed: `argv` (the fine-tune's flags, `--recipe` among them) with the seed,
    its output folder and, for a recipe that pre-trains its own checkpoint, its own pre-training folder."""
    owned = [name for name in OWNED_FLAGS if given_as_flag(argv, name)]
    if owned:
        raise ValueError(
            f"--{owned[0]} is set by the seeds loop for each run; drop it (the runs go to --output_dir/seed-N)."
        )
    if not given_as_flag(argv, "recipe"):
        raise ValueError("--recipe is required: the recipe to repeat under each seed (e.g. --recipe digits).")
    # every flag is checked as the fine-tune will check it: a mistyped one fails here, before the first run
    model_args, _, _ = parse_args([*argv, "--output_dir", str(output_dir / f"seed-{seeds[0]}")])
    # a recipe with a built-in pre-training (not turned off by a flag) pre-trains each seed's own checkpoint
    pretrains = model_args.pretrain_if_missing is not None
    own_checkpoint = pretrains and not given_as_flag(argv, "model_name_or_path")
    commands = {}
    for seed in seeds:
        line = [sys.executable, "-m", FINETUNE_MODULE, *argv, "--seed", str(seed)]
        line += ["--output_dir", str(output_dir / f"seed-{seed}")]
        if own_checkpoint:
            line += ["--model_name_or_path", str(output_dir / f"pretrained-seed-{seed}")]
        commands[seed] = line
    return commands


def _accuracy(run_dir: Path) -> tuple[str, float]:
    results = json.loads((run_dir / "all_results.json").read_text())
    for key in ("test_accuracy", "eval_accuracy", "test_mAP", "eval_mAP"):  # mAP: a multi-label run
        if key in results:
            return key, float(results[key])
    raise ValueError(
        f"{run_dir / 'all_results.json'} has no test_accuracy or eval_accuracy (test_mAP / eval_mAP)."
    )


def run_seeds(argv: list[str], seeds: list[int], output_dir: str | os.PathLike) -> dict[str, Any]:
    """Run the fine-tune once per seed (one process each, one after another) and summarise; returns the summary
    written to OUTPUT/seeds.json."""
    output_dir = Path(output_dir)
    commands = seed_commands(argv, seeds, output_dir)
    with output_lock(
        output_dir, "vit-ft seeds"
    ):  # a second seeds loop into OUTPUT is refused, naming this one
        runs = [_run_seed(seed, command, output_dir) for seed, command in commands.items()]
        summary = _summarise(runs, next(k for k in runs[0] if k not in ("seed", "seconds")), argv)
        write_text_atomically(output_dir / SEEDS_JSON, json.dumps(summary, indent=2) + "\n")
        write_text_atomically(output_dir / SEEDS_MD, to_markdown(summary))
    return summary


def _run_seed(seed: int, command: list[str], output_dir: Path) -> dict[str, Any]:
    """Run one seed's fine-tune (its output in OUTPUT/seed-N.log); its accuracy and wall time."""
    log_path = output_dir / f"seed-{seed}.log"
    logger.info("seed %d: %s (output in %s)", seed, " ".join(command[1:]), log_path)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if returncode != 0:
        lines = [line for line in log_path.read_text().splitlines() if line.strip()]
        last = lines[-1] if lines else "(no output)"
        raise ValueError(f"seed {seed} failed (exit {returncode}): {last} (full log: {log_path})")
    metric, accuracy = _accuracy(output_dir / f"seed-{seed}")
    logger.info("seed %d: %s %.4f in %.0f s", seed, metric, accuracy, seconds)
    return {"seed": seed, metric: accuracy, "seconds": round(seconds, 1)}


def _summarise(runs: list[dict[str, Any]], metric: str, argv: list[str]) -> dict[str, Any]:
    values = [run[metric] for run in runs]
    times = [run["seconds"] for run in runs]
    return {
        "command": ["vit-ft", "finetune", *argv],
        "metric": metric,
        "runs": runs,
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "median_seconds": statistics.median(times),
        "max_seconds": max(times),
    }


def to_markdown(summary: dict[str, Any]) -> str:
    metric = summary["metric"]
    lines = [
        f"`{' '.join(summary['command'])}`, one process per seed",
        "",
        f"| seed | {metric} | wall time (s) |",
        "| ---: | ---: | ---: |",
    ]
    lines += [
        f"| {run['seed']} | {100 * run[metric]:.2f}% | {run['seconds']:.0f} |" for run in summary["runs"]
    ]
    lines += [
        f"| mean | {100 * summary['mean']:.2f}% (std {100 * summary['std']:.2f}) | "
        f"median {summary['median_seconds']:.0f} |",
        f"| lowest, highest | {100 * summary['min']:.2f}%, {100 * summary['max']:.2f}% | "
        f"max {summary['max_seconds']:.0f} |",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["parse_seeds", "run_seeds", "seed_commands", "to_markdown"]
