"""What people read of a few-shot evaluation (`vit_ft.tools.fewshot`): fewshot.md (the table), fewshot.json (the
record) and fewshot.png (accuracy against shots), drawn from the record that `run_fewshot` returns."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

from ..utils.files import staged_file  # noqa: E402

OUTPUT_FILES = ("fewshot.md", "fewshot.json", "fewshot.png")


def results_table(results: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of the record's `results`: one row per k with mean ± std test accuracy (%) over seeds
    and each seed's value."""
    lines = [
        "| shots per class | accuracy (mean ± std over seeds) | per seed | chosen l2 |",
        "| --- | --- | --- | --- |",
    ]
    for r in results:
        per_seed = ", ".join(f"{100 * a:.1f}" for a in r["accuracies"])
        l2s = ", ".join(f"2^{math.log2(v):g}" for v in r["l2"])
        mean, std = 100 * r["mean_accuracy"], 100 * r["std_accuracy"]
        lines.append(f"| {r['shots']} | {mean:.1f} % ± {std:.1f} | {per_seed} | {l2s} |")
    return "\n".join(lines) + "\n"


def fewshot_markdown(record: dict[str, Any]) -> str:
    """fewshot.md: what was evaluated on what, how, and the results table."""
    what = record["model"] + (" (randomly initialised weights)" if record["random_init"] else "")
    height, width = record["image_size"]
    setup = (
        f"Data: {record['dataset']}, {record['num_classes']} classes, {record['num_test_images']} test images. "
        f"Frozen pre-logit features ({record['feature_dim']} dimensions, {height}x{width} px, bf16 "
        f"{'on' if record['bf16'] else 'off'}); regularised least squares to {{-1, 1}}^K targets on k images per "
        f"class, the regularisation chosen on {record['holdout_images']} held-out training images; "
        f"{record['seeds']} seed(s)."
    )
    text = f"# Few-shot linear evaluation: {what}\n\n{setup}\n\n{results_table(record['results'])}"
    if record["skipped"]:
        text += f"\n{len(record['skipped'])} images did not decode (listed in fewshot.json).\n"
    return text


def plot_fewshot(results: Sequence[dict[str, Any]], path: str | os.PathLike, title: str) -> Path:
    """Test accuracy against shots per class (log axis), mean with ± std error bars, as a PNG."""
    shots = [r["shots"] for r in results]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    means = [100 * r["mean_accuracy"] for r in results]
    ax.errorbar(shots, means, yerr=[100 * r["std_accuracy"] for r in results], marker="o", capsize=4)
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(k) for k in shots])
    ax.minorticks_off()
    ax.set_xlabel("training images per class")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_fewshot_report(output_dir: str | os.PathLike, record: dict[str, Any]) -> None:
    """fewshot.md, fewshot.json and fewshot.png in `output_dir`, each written to a temporary file and renamed
    into place (`utils.files.staged_file`), so an interrupted run leaves the previous files whole."""
    output_dir = Path(output_dir)
    title = f"Few-shot linear accuracy: {record['model']}" + (
        " (random init)" if record["random_init"] else ""
    )
    with ExitStack() as stack:
        staged = {name: stack.enter_context(staged_file(output_dir / name)) for name in OUTPUT_FILES}
        staged["fewshot.md"].write_text(fewshot_markdown(record), encoding="utf-8")
        staged["fewshot.json"].write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        plot_fewshot(record["results"], staged["fewshot.png"], title)


__all__ = ["OUTPUT_FILES", "fewshot_markdown", "plot_fewshot", "results_table", "write_fewshot_report"]
