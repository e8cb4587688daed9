"""The harness's table: each method's top-1 test accuracy per task (mean over seeds, with the spread), per
group and the mean over the suite's tasks, beside the published rows, with the versions, hardware and seeds
(`results.md` and `results.json`)."""

from __future__ import annotations

import json
import platform
import statistics
from importlib import metadata
from pathlib import Path
from typing import Any

from ..utils.files import write_text_atomically
from ..utils.hardware import cpu_model
from .protocols import PROTOCOL_SOURCE
from .suites import PUBLISHED, PUBLISHED_MEANS, V_PETL, Suite

RESULTS_JSON, RESULTS_MD = "results.json", "results.md"
PACKAGES = ("vit-ft", "torch", "transformers", "peft", "datasets", "accelerate")


def environment() -> dict[str, Any]:
    """The versions and the hardware a table was measured with."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"versions": versions, "python": platform.python_version(), "cpu": cpu_model(), "gpu": gpu}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(suite: Suite, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: each task's mean / spread over seeds (accuracy in %), each group's mean and the suite's
    mean (None until every task of the group / suite has a result)."""
    methods: dict[str, Any] = {}
    for method in dict.fromkeys(r["method"] for r in results):
        tasks = {}
        for task in suite.tasks:
            scores = [100 * r["test_accuracy"] for r in results if r["method"] == method and r["task"] == task.name]
            if scores:
                spread = statistics.stdev(scores) if len(scores) > 1 else None
                tasks[task.name] = {"mean": statistics.fmean(scores), "std": spread, "seeds": len(scores)}
        groups = {}
        for group in dict.fromkeys(t.group for t in suite.tasks):
            names = [t.name for t in suite.tasks if t.group == group]
            done = [tasks[n]["mean"] for n in names if n in tasks]
            groups[group] = _mean(done) if len(done) == len(names) else None
        complete = len(tasks) == len(suite.tasks)
        methods[method] = {"tasks": tasks, "groups": groups, "mean": _mean([t["mean"] for t in tasks.values()]) if complete else None}
    return methods


def _cell(value: float | None, spread: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if spread is None else f"{value:.1f} ± {spread:.1f}"


def _markdown(suite: Suite, summary: dict[str, Any], record: dict[str, Any]) -> str:
    groups = list(dict.fromkeys(t.group for t in suite.tasks))
    multi_group = len(groups) > 1
    header = ["method", *[t.name for t in suite.tasks], *(groups if multi_group else []), "mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for method, row in summary.items():
        cells = [_cell(row["tasks"][t.name]["mean"], row["tasks"][t.name]["std"]) if t.name in row["tasks"] else "-" for t in suite.tasks]
        cells += [_cell(row["groups"][g]) for g in groups] if multi_group else []
        lines.append("| " + " | ".join([method, *cells, _cell(row["mean"])]) + " |")
    for method, scores in PUBLISHED.get(suite.name, {}).items():
        by_group = [statistics.fmean(s for s, t in zip(scores, suite.tasks, strict=True) if t.group == g) for g in groups]
        cells = [f"{s:.1f}" for s in scores] + ([f"{m:.1f}" for m in by_group] if multi_group else [])
        lines.append("| " + " | ".join([f"{method} (published)", *cells, f"{statistics.fmean(scores):.2f}"]) + " |")
    for method, mean in PUBLISHED_MEANS.get(suite.name, {}).items():
        lines.append("| " + " | ".join([f"{method} (published)", *["-"] * (len(header) - 2), f"{mean:.1f}"]) + " |")
    env = record["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    return "\n".join([
        f"# {suite.name}: top-1 test accuracy (%)", "",
        f"Model {record['model']}; seeds {', '.join(map(str, record['seeds']))} (mean ± standard deviation over "
        f"seeds where more than one); {env['gpu'] or env['cpu']}; {versions}. A group's or the suite's mean is "
        "shown once all its tasks have a result.", "",
        *lines, "",
        f"Published rows: {V_PETL} (ViT-B/16 ImageNet-21k); the protocol: {PROTOCOL_SOURCE}. Differences from it: "
        "training on the suite's train split only (VTAB-1k: 800 images, its 200 validate), the test accuracy of "
        "the epoch best on validation (V-PETL: the best test accuracy), transformers' cosine schedule to 0. Flags given after the suite override the protocol "
        f"({' '.join(record['extra_flags']) or 'none given'}).", "",
    ])  # fmt: skip


def write_table(folder: Path, suite: Suite, results: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
    """results.json (every cell, the summary, the record) and results.md in `folder`; returns the summary."""
    summary = summarize(suite, results)
    record = {**record, "environment": environment()}
    body = {"suite": suite.name, **record, "summary": summary, "cells": results}
    write_text_atomically(folder / RESULTS_JSON, json.dumps(body, indent=2) + "\n")
    write_text_atomically(folder / RESULTS_MD, _markdown(suite, summary, record))
    return summary


__all__ = ["RESULTS_JSON", "RESULTS_MD", "environment", "summarize", "write_table"]
