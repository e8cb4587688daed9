"""What people read of robustness: the shift table (clean against corrupted or shifted accuracy, the relative
corruption error) and its figure for `vit-ft evaluate --shift`, the same table in a model card (`shift_card_lines`,
read from an evaluation's metrics.json by `evaluation_shift`), and WiSE-FT's curve (validation and shifted
accuracy over the mixing weight alpha) for `vit-ft wise`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

from .reporting import markdown_table, write_csv  # noqa: E402

SHIFT_COLUMNS = ("shift", "family", "severity 1", "severity 2", "severity 3", "accuracy", "relative error")
WISE_COLUMNS = ("alpha", "validation", "shifted")


def write_shift_table(folder: Path, shift: dict[str, Any]) -> list[str]:
    """shift.csv, shift.md and shift.png of a `--shift` evaluation in `folder`; returns report.md's section."""
    rows = shift["rows"]
    write_csv(folder / "shift.csv", rows)
    table = _shift_table(rows)
    (folder / "shift.md").write_text(table, encoding="utf-8")
    figure, axis = plt.subplots(figsize=(max(4.0, 0.6 * len(rows) + 2), 3.5))
    names = [row["shift"] for row in rows]
    axis.bar(names, [100 * row["accuracy"] for row in rows], color="tab:orange", label="shifted")
    axis.axhline(100 * shift["clean"], color="tab:blue", linestyle="--", label=f"clean {100 * shift['clean']:.1f} %")
    axis.set_ylabel("top-1 accuracy (%)")
    axis.set_ylim(0, 100)
    axis.tick_params(axis="x", labelrotation=45)
    # outside the axes, below the title: inside, it covered the last bars (which reach any height)
    axis.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, fontsize="small")
    axis.set_title(f"Accuracy under shift ({shift['kind']})", pad=28)
    figure.tight_layout()
    figure.savefig(folder / "shift.png", dpi=120)
    plt.close(figure)
    return ["## Robustness under shift", "", _shift_sentence(shift), "", table, "![accuracy under shift](shift.png)", ""]


def _shift_table(rows: Sequence[dict[str, Any]]) -> str:
    return markdown_table(list(rows), [c for c in SHIFT_COLUMNS if c in rows[0]])


def _shift_sentence(shift: dict[str, Any]) -> str:
    return (f"Clean accuracy {100 * shift['clean']:.2f} %; mean shifted accuracy {100 * shift['mean_accuracy']:.2f} %; "
            f"relative error (the mean shifted error minus the clean error, Hendrycks & Dietterich's numerator) "
            f"{100 * shift['relative_error']:.2f} points. {shift['how']}")  # fmt: skip


def shift_card_lines(shift: dict[str, Any], data: str) -> list[str]:
    """A model card's robustness section: clean against shifted accuracy and the relative corruption error, with
    the seed and severities (`shift["how"]`); `data` is what was evaluated clean."""
    return ["## Robustness under shift", "", f"Measured by `vit-ft evaluate --shift` on {data}. {_shift_sentence(shift)}",
            "", _shift_table(shift["rows"]), ""]  # fmt: skip


def evaluation_shift(report: str | os.PathLike, model: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The shift section of the `vit-ft evaluate --shift` report folder `report` and the data it was measured on,
    for `model`'s card. ValueError, one line, for a folder without one or an evaluation of another model."""
    path = Path(report).expanduser() / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"--evaluation {os.fspath(report)}: no metrics.json there; pass the --output_dir of "
                                f"`vit-ft evaluate --model {os.fspath(model)} --shift corruptions`.")  # fmt: skip
    metrics = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(metrics.get("shift"), dict):
        raise ValueError(f"--evaluation {os.fspath(report)} was evaluated without --shift; run `vit-ft evaluate --model "
                         f"{os.fspath(model)} --output_dir {os.fspath(report)} --shift corruptions` first.")  # fmt: skip
    evaluated = Path(str(metrics.get("model", ""))).expanduser()
    if evaluated.exists() and evaluated.resolve() != Path(model).expanduser().resolve():
        raise ValueError(f"--evaluation {os.fspath(report)} evaluated {metrics['model']}, not {os.fspath(model)}; pass "
                         "an evaluation of this model.")  # fmt: skip
    return metrics["shift"], str(metrics.get("data") or "its evaluation images")


def write_wise_curve(folder: Path, curve: Sequence[dict[str, Any]], chosen: float, shifted: str | None) -> str:
    """wise.csv, wise.md and wise.png: validation (and shifted) accuracy over alpha; returns the Markdown table."""
    write_csv(folder / "wise.csv", curve)
    columns = [c for c in WISE_COLUMNS if c in curve[0]]
    table = markdown_table(curve, columns)
    (folder / "wise.md").write_text(table, encoding="utf-8")
    figure, axis = plt.subplots(figsize=(5, 3.5))
    alphas = [row["alpha"] for row in curve]
    axis.plot(alphas, [100 * row["validation"] for row in curve], marker="o", label="validation")
    if shifted:
        axis.plot(alphas, [100 * row["shifted"] for row in curve], marker="s", label=f"shifted ({shifted})")
    axis.axvline(chosen, color="grey", linestyle=":", label=f"alpha {chosen:g}")
    axis.set_xlabel("alpha (0: zero-shot, 1: fine-tuned)")
    axis.set_ylabel("top-1 accuracy (%)")
    axis.legend()
    axis.set_title("WiSE-FT: weights interpolated")
    figure.tight_layout()
    figure.savefig(folder / "wise.png", dpi=120)
    plt.close(figure)
    return table


__all__ = ["SHIFT_COLUMNS", "WISE_COLUMNS", "evaluation_shift", "shift_card_lines", "write_shift_table", "write_wise_curve"]
