"""What a sweep over `seed` leaves: the same fine-tune under several seeds, summarised, with no winner.

    vit-ft finetune --recipe digits --sweep seed=0,1,2 --output_dir outputs/digits-seeds --process_per_run
    vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/digits-seeds    # the same command

How much of a recipe's accuracy is the recipe and how much is one lucky seed: the sweep (`vit_ft.training.sweep`)
runs each seed into OUTPUT/seed-N (its log in OUTPUT/seed-N.log) and, for a recipe with a built-in pre-training
(`pretrain_if_missing`) whose checkpoint the command line does not name, pre-trains each seed's own checkpoint
in OUTPUT/pretrained-seed-N (`pretraining_folder`). Nothing is chosen or copied into OUTPUT: OUTPUT/seeds.md (the
table) and seeds.json list every seed's test accuracy (validation accuracy when the recipe has no test split;
mAP for a multi-label recipe) and wall time, with their mean, lowest and highest.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from ..utils.files import write_text_atomically

SEED = "seed"  # the argument whose sweep is summarised here
SEEDS_JSON = "seeds.json"
SEEDS_MD = "seeds.md"
_METRICS = ("test_accuracy", "eval_accuracy", "test_mAP", "eval_mAP")  # the first the run has is reported


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; at least one seed, no repeats."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers such as 0,1,2, got {text!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds takes distinct comma-separated integers such as 0,1,2, got {text!r}.")
    return seeds


def seed_folder(output_dir: str | Path, text: str) -> Path:
    """The run folder of one seed, OUTPUT/seed-N."""
    return Path(output_dir) / f"seed-{text}"


def pretraining_folder(output_dir: str | Path, text: str) -> Path:
    """Where one seed's own built-in pre-training goes, OUTPUT/pretrained-seed-N."""
    return Path(output_dir) / f"pretrained-seed-{text}"


def seed_metric(run_dir: Path) -> tuple[str, float]:
    """The number a seed is summarised by, from its all_results.json: test accuracy, else validation accuracy
    (mAP for a multi-label run)."""
    results = json.loads((run_dir / "all_results.json").read_text())
    for key in _METRICS:
        if key in results:
            return key, float(results[key])
    raise ValueError(
        f"{run_dir / 'all_results.json'} has no test_accuracy or eval_accuracy (test_mAP / eval_mAP)."
    )


def summarize_seeds(
    seeds: list[int], folders: list[Path], seconds: list[float | None], command: list[str]
) -> dict[str, Any]:
    """What seeds.json holds: each seed's metric and wall time (None for a run a resumed sweep kept), their mean,
    spread, lowest and highest. `command` is the fine-tune each seed ran, without its seed and folder."""
    found = [seed_metric(folder) for folder in folders]
    metric = found[0][0]
    runs = []
    for seed, folder, (key, value), time in zip(seeds, folders, found, seconds, strict=True):
        if key != metric:
            raise ValueError(
                f"{folder} reports {key}, the other seeds {metric}; run them with the same recipe."
            )
        runs.append({"seed": seed, metric: value, "seconds": None if time is None else round(time, 1)})
    values = [run[metric] for run in runs]
    times = [run["seconds"] for run in runs if run["seconds"] is not None]
    return {
        "command": command,
        "metric": metric,
        "runs": runs,
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "median_seconds": statistics.median(times) if times else None,
        "max_seconds": max(times) if times else None,
    }


def _seconds(value: float | None, prefix: str = "") -> str:
    return "-" if value is None else f"{prefix}{value:.0f}"


def to_markdown(summary: dict[str, Any], process_per_run: bool = True) -> str:
    """seeds.md: one row per seed (metric in %, wall time), then the mean (std) and the lowest, highest."""
    metric = summary["metric"]
    lines = [
        f"`{' '.join(summary['command'])}`, {'one process per seed' if process_per_run else 'in one process'}",
        "",
        f"| seed | {metric} | wall time (s) |",
        "| ---: | ---: | ---: |",
    ]
    lines += [
        f"| {run['seed']} | {100 * run[metric]:.2f}% | {_seconds(run['seconds'])} |"
        for run in summary["runs"]
    ]
    lines += [
        f"| mean | {100 * summary['mean']:.2f}% (std {100 * summary['std']:.2f}) | "
        f"{_seconds(summary['median_seconds'], 'median ')} |",
        f"| lowest, highest | {100 * summary['min']:.2f}%, {100 * summary['max']:.2f}% | "
        f"{_seconds(summary['max_seconds'], 'max ')} |",
    ]
    return "\n".join(lines) + "\n"


def write_seed_files(output_dir: Path, summary: dict[str, Any], process_per_run: bool) -> None:
    """seeds.json (machine-readable) and seeds.md (the table), each written whole."""
    write_text_atomically(output_dir / SEEDS_JSON, json.dumps(summary, indent=2) + "\n")
    write_text_atomically(output_dir / SEEDS_MD, to_markdown(summary, process_per_run))


__all__ = [
    "SEED",
    "SEEDS_JSON",
    "SEEDS_MD",
    "parse_seeds",
    "pretraining_folder",
    "seed_folder",
    "seed_metric",
    "summarize_seeds",
    "to_markdown",
    "write_seed_files",
]
