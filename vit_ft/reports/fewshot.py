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
import numpy as np  # noqa: E402

from ..utils.files import staged_file  # noqa: E402
from .charts import zoomed_fraction_limits  # noqa: E402
from .figures import save_figure  # noqa: E402

OUTPUT_FILES = ("fewshot.md", "fewshot.json", "fewshot.png")


def edge_choices(results: Sequence[dict[str, Any]], l2_grid: Sequence[float] | None) -> tuple[int, int]:
    """(how many draws chose an l2 at either end of `l2_grid`, how many draws in all): a choice at the edge
    of its search range may have wanted a value beyond it. No grid, or a grid of one value: (0, draws)."""
    chosen = [v for r in results for v in r["l2"]]
    if not l2_grid or len(l2_grid) < 2:
        return 0, len(chosen)
    ends = (min(l2_grid), max(l2_grid))
    return sum(math.isclose(v, end) for v in chosen for end in ends), len(chosen)


def edge_note(results: Sequence[dict[str, Any]], l2_grid: Sequence[float] | None) -> str:
    """The sentence that flags l2 choices at the edge of the grid ("" when none is): how many, and the range."""
    at_edge, draws = edge_choices(results, l2_grid)
    if not at_edge:
        return ""
    low, high = math.log2(min(l2_grid)), math.log2(max(l2_grid))
    return (f"{at_edge} of {draws} draws chose the l2 at the edge of its search range (2^{low:g} .. 2^{high:g}, "
            "marked *): the best value may lie beyond it.")  # fmt: skip


def results_table(results: Sequence[dict[str, Any]], l2_grid: Sequence[float] | None = None) -> str:
    """The Markdown table of the record's `results`: one row per k with mean ± std test accuracy (%) over seeds
    and each seed's value, the chosen l2 of each seed (* where it is an end of `l2_grid`), and the kNN
    evaluator's mean test accuracy on the same images (where the record has it)."""
    lines = [
        "| shots per class | accuracy (mean ± std over seeds) | per seed | chosen l2 | kNN accuracy (mean) |",
        "| --- | --- | --- | --- | --- |",
    ]
    ends = (min(l2_grid), max(l2_grid)) if l2_grid and len(l2_grid) > 1 else ()
    for r in results:
        per_seed = ", ".join(f"{100 * a:.1f}" for a in r["accuracies"])
        l2s = ", ".join(
            f"2^{math.log2(v):g}" + ("*" if any(math.isclose(v, end) for end in ends) else "") for v in r["l2"]
        )
        mean, std = 100 * r["mean_accuracy"], 100 * r["std_accuracy"]
        knn = r.get("knn_mean_accuracy")
        knn_text = "-" if knn is None else f"{100 * knn:.1f} %"
        lines.append(f"| {r['shots']} | {mean:.1f} % ± {std:.1f} | {per_seed} | {l2s} | {knn_text} |")
    return "\n".join(lines) + "\n"


def fewshot_markdown(record: dict[str, Any]) -> str:
    """fewshot.md: what was evaluated on what, how, and the results table (l2 choices at the edge of the grid
    flagged)."""
    what = record["model"] + (" (randomly initialised weights)" if record["random_init"] else "")
    height, width = record["image_size"]
    setup = (
        f"Data: {record['dataset']}, {record['num_classes']} classes, {record['num_test_images']} test images. "
        f"Frozen pre-logit features ({record['feature_dim']} dimensions, {height}x{width} px, bf16 "
        f"{'on' if record['bf16'] else 'off'}); regularised least squares to {{-1, 1}}^K targets on k images per "
        f"class, the regularisation chosen on {record['holdout_images']} held-out training images; "
        f"{record['seeds']} seed(s). kNN: DINOv2's weighted vote (20 nearest by cosine, T = 0.07) over the "
        "same k-shot images."
    )
    grid = record.get("l2_grid")
    text = f"# Few-shot linear evaluation: {what}\n\n{setup}\n\n{results_table(record['results'], grid)}"
    note = edge_note(record["results"], grid)
    if note:
        text += f"\n{note}\n"
    if record["skipped"]:
        text += f"\n{len(record['skipped'])} images did not decode (listed in fewshot.json).\n"
    return text


def plot_fewshot(
    results: Sequence[dict[str, Any]], path: str | os.PathLike, title: str, num_classes: int | None = None,
    l2_grid: Sequence[float] | None = None,
) -> Path:  # fmt: skip
    """Test accuracy against shots per class (log axis), mean with ± std error bars, as a PNG. The y axis is
    zoomed to the points (`charts.zoomed_fraction_limits`, its start named in the panel) with the chance
    accuracy of `num_classes` as a dotted line, or named beside the start when the zoom leaves it below;
    l2 choices at the edge of `l2_grid` are flagged under the title and ringed on their k."""
    shots = [r["shots"] for r in results]
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    means = np.array([r["mean_accuracy"] for r in results])
    stds = np.array([r["std_accuracy"] for r in results])
    ax.errorbar(shots, 100 * means, yerr=100 * stds, marker="o", capsize=4, label="mean ± std over seeds")
    chance = 1 / num_classes if num_classes else None
    low, _ = zoomed_fraction_limits(np.r_[means - stds, means], floor=1.0)
    if chance is not None and chance >= low:
        ax.axhline(100 * chance, linestyle=":", color="0.3", label=f"chance ({100 * chance:.1f} %)")
    if low > 0:  # zoomed: say where the axis starts, and where chance is
        below = f"; chance ({100 * chance:.1f} %) below it" if chance is not None and chance < low else ""
        ax.text(0.02, 0.02, f"axis from {100 * low:.0f} %, not 0{below}", transform=ax.transAxes, fontsize=8,
                color="0.3", va="bottom")  # fmt: skip
    ax.set_ylim(100 * low, 100.5)
    ends = (min(l2_grid), max(l2_grid)) if l2_grid and len(l2_grid) > 1 else ()
    edge = [r for r in results if any(math.isclose(v, end) for v in r["l2"] for end in ends)]
    if edge:
        ax.plot([r["shots"] for r in edge], [100 * r["mean_accuracy"] for r in edge], "o", markersize=13,
                markerfacecolor="none", markeredgecolor="tab:red", label="l2 chosen at the edge of its range")  # fmt: skip
        at_edge, draws = edge_choices(results, l2_grid)
        title += f"\n{at_edge} of {draws} draws chose l2 at the edge of its search range"
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(k) for k in shots])
    ax.minorticks_off()
    ax.set_xlabel("training images per class")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)  # the curve rises to the right; its start is low
    ax.set_title(title, fontsize=9, color="tab:red" if edge else "black")
    return save_figure(fig, path)


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
        plot_fewshot(record["results"], staged["fewshot.png"], title, record["num_classes"], record.get("l2_grid"))


__all__ = ["OUTPUT_FILES", "edge_choices", "edge_note", "fewshot_markdown", "plot_fewshot", "results_table", "write_fewshot_report"]
