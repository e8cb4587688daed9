"""What `vit-ft audit` writes: findings.csv (every finding, sorted by score within each kind), relabel.csv (one row
per flagged training image with the action the fine-tune's `exclude:` takes, for the user to edit), report.md
(counts, the probe, one image grid per kind) and audit.json; the grids `audit_<kind>.png` show what the model saw
with the given and suggested label, or the copy beside its original."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.exclusions import FINDINGS_COLUMNS, KINDS, RELABEL_COLUMNS
from .figures import _empty_figure, plot_image_grid, short, shown_image

GRID_IMAGES = 24  # findings shown per kind (the highest scores); findings.csv has them all
OUTPUT_FILES = ("findings.csv", "relabel.csv", "report.md", "audit.json", *(f"audit_{kind}.png" for kind in KINDS))
WHAT = {
    "label_issue": "training images whose given label the out-of-fold probe doubts (given -> suggested)",
    "duplicate": "training images that are a copy of an earlier training image",
    "leak": "training images that are a copy of a validation or test image (an accuracy that lies)",
    "outlier": "training images far from every other (k-th nearest neighbour distance)",
}
DEFAULT_ACTION = {"label_issue": "relabel", "duplicate": "drop", "leak": "drop", "outlier": "drop"}


@dataclass(frozen=True)
class AuditImage:
    """A finding (`tools.audit.findings.Finding`) with its image, the path findings.csv names it by, and for a
    copy the other image and its path."""

    finding: Any
    image: Any
    path: str
    other: Any = None
    other_path: str = ""


def _sorted(rows: Sequence[AuditImage]) -> list[AuditImage]:
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(rows, key=lambda r: (order[r.finding.kind], -r.finding.score, r.path))


def _label(names: list[str], label: int | tuple[int, ...]) -> str:
    """A class name, or a multi-label set's names joined by ";" (labels.csv's separator); "" for none."""
    if isinstance(label, tuple):
        return ";".join(names[i] for i in label)
    return names[label] if label >= 0 else ""


def findings_csv(rows: Sequence[AuditImage], names: list[str]) -> str:
    """findings.csv's text: FINDINGS_COLUMNS, by kind then score, highest first."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FINDINGS_COLUMNS)
    for row in _sorted(rows):
        f = row.finding
        writer.writerow([row.path, f.kind, f"{f.score:.4f}", _label(names, f.given), _label(names, f.suggested),
                         row.other_path])  # fmt: skip
    return buffer.getvalue()


def relabel_csv(rows: Sequence[AuditImage], names: list[str], min_score: float | None = 0.0) -> str:
    """relabel.csv's text: one row per flagged training image (its first finding: kind order, then score), with
    the action the fine-tune takes (`drop` for an image with any copy or outlier finding, `relabel` to the
    suggestion for a label issue alone scored at least `min_score`, `keep` for one below it: the audit's
    self-check measured its flags there less often right than wrong; None: no score reached that); a user edits
    action and label."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RELABEL_COLUMNS)
    drops = {row.path for row in rows if row.finding.split == "train" and DEFAULT_ACTION[row.finding.kind] == "drop"}
    seen: set[str] = set()
    for row in _sorted(rows):
        f = row.finding
        if f.split != "train" or row.path in seen:
            continue
        seen.add(row.path)
        action = "drop" if row.path in drops else DEFAULT_ACTION[f.kind]  # a copy or outlier is dropped, not relabelled
        if action == "relabel" and (min_score is None or f.score < min_score or isinstance(f.suggested, tuple)):
            # not proposed: below the score from which the self-check's flags were mostly right, or a multi-label
            # set (the fine-tune's --exclude drops such images but does not relabel them: edit the action to drop)
            action = "keep"
        label = _label(names, f.suggested) if action == "relabel" else ""
        writer.writerow([row.path, action, label, _label(names, f.given), f.kind, f"{f.score:.4f}"])
    return buffer.getvalue()


def plot_findings(
    rows: Sequence[AuditImage], kind: str, names: list[str], image_size: tuple[int, int], path: str | os.PathLike
) -> Path:
    """The grid of one kind's highest-scored findings: the image as the model saw it, titled with its score and
    given -> suggested label; a copy shown beside the image it copies."""
    chosen = [row for row in _sorted(rows) if row.finding.kind == kind][:GRID_IMAGES]
    if not chosen:
        return _empty_figure(f"no {kind.replace('_', ' ')}s", path)
    images, titles = [], []
    for row in chosen:
        f = row.finding
        given = short(_label(names, f.given), 10)
        if kind in ("duplicate", "leak"):
            images += [shown_image(row.image, image_size), shown_image(row.other, image_size)]
            titles += [" ".join(part for part in ("train", given, f"({f.score:.3f})") if part),
                       f"its copy in {f.other_split}"]
        else:
            images.append(shown_image(row.image, image_size))
            suggested = f" -> {short(_label(names, f.suggested), 10)}" if f.suggested not in (-1, ()) else ""
            titles.append(f"{given}{suggested} ({f.score:.2f})")
    columns = 6 if kind in ("duplicate", "leak") else None
    return plot_image_grid(images, titles, path, suptitle=f"{kind.replace('_', ' ')}s: {WHAT[kind]}", columns=columns)


def quality_lines(record: dict[str, Any]) -> list[str]:
    """report.md's first lines: the audit's own quality (out-of-fold accuracy, estimated noise rate, estimated
    precision from the self-check), the warning first when that precision is below the floor."""
    quality, probe = record["quality"], record["probe"]
    check = quality["self_check"]
    lines = []
    if quality["low_precision"]:
        proposed = (f"relabel.csv proposes only the {quality['proposed']} label issues scored at least "
                    f"{quality['min_score']:.4f}" if quality["min_score"] is not None else
                    "relabel.csv proposes no relabel (every label issue's action is keep)")  # fmt: skip
        lines += [f"**Warning: estimated precision {quality['precision']:.2f} (lower bound "
                  f"{quality['precision_low']:.2f}) is below {quality['precision_floor']}: most flagged labels are "
                  "probably right; the features separate the classes too little to tell (a backbone that knows this "
                  f"data better, more images, or `--oof finetune` if not run, would). {proposed}.**", ""]  # fmt: skip
    if quality.get("weaker_than_pixels"):
        lines += [f"**Warning: the model's features separate these labels worse than the images' raw pixels "
                  f"(best out-of-fold log-loss {quality['features_log_loss']:.4f} against the pixels' "
                  f"{probe['log_loss']:.4f}): the label issues come from the probe on the pixels; a backbone that "
                  "knows this data would audit it better.**", ""]  # fmt: skip
    lines += [
        f"- out-of-fold accuracy {100 * quality['accuracy']:.2f} % ({probe['chosen']} probe, log-loss "
        f"{probe['log_loss']:.4f})",
        f"- estimated noise rate {100 * quality['noise_rate']:.2f} % ({quality['estimated_issues']} labels: "
        "confident learning's estimate, which bounds the label issues flagged)",
        f"- estimated precision {quality['precision']:.2f} (lower bound {quality['precision_low']:.2f}), recall "
        f"{quality['recall']:.2f} (self-check: "
        f"{check['flipped']} labels flipped in a copy, the probe and the flagging run again, {check['flagged']} "
        "flagged)",
        "",
        "| space/probe | out-of-fold log-loss | accuracy | seconds |",
        "| --- | --- | --- | --- |",
        *(f"| {name}{' (chosen)' if name == probe['chosen'] else ''} | {c['log_loss']:.4f} | "
          f"{100 * c['accuracy']:.2f} % | {c['seconds']:.2f} |" for name, c in probe["candidates"].items()),
        "",
    ]  # fmt: skip
    return lines


def _finetunes(record: dict[str, Any]) -> str:
    """", and k-fold fine-tunes of the model (...)" where `--oof finetune` ran them, else ""."""
    oof = record.get("oof_finetune")
    if not oof:
        return ""
    flags = f", with `{' '.join(oof['flags'])}`" if oof["flags"] else ""
    return f" and {record['folds']} fine-tunes of the model ({oof['method']}, {oof['steps']} steps each{flags})"


def report_markdown(record: dict[str, Any]) -> str:
    """report.md: the audit's own quality first, then what was audited, the counts per kind, and the grids."""
    skipped = f" ({record['skipped']} skipped: they do not decode)" if record["skipped"] else ""
    held = ", ".join(f"{split} {count}" for split, count in record["held_out"].items()) or "none"
    multi = record.get("multi_label", False)
    lines = [
        "# Data audit",
        "",
        *quality_lines(record),
        f"Model `{record['model']}` on {record['dataset']}: {record['num_train_images']} training images, held "
        f"out (searched for leaks): {held}{skipped}.",
        "",
        f"Out-of-fold probabilities: {record['folds']}-fold probes on the frozen pooled features and on the raw "
        f"pixels (8x8 grey){_finetunes(record)}, the one of lowest "
        f"log-loss chosen ({record['disagreements']} images whose most probable {'label set' if multi else 'class'} "
        "is not their label). Label issues: the images of lowest out-of-fold probability of their given label"
        f"{' set' if multi else ''}, as many as confident learning estimates wrong (cleanlab's "
        f"{'multi-label ' if multi else ''}low_self_confidence filter"
        f"{'' if multi else '; its default filter flagged ' + str(len(record['compared']['cleanlab']))}); score 1 - "
        f"{'its label quality score, suggestion the labels of probability above 0.5' if multi else 'p(given), suggestion the most probable other class'}.",
        "",
        "| kind | images | what |",
        "| --- | --- | --- |",
        *(f"| {kind} | {record['counts'][kind]} | {WHAT[kind]} |" for kind in KINDS),
        "",
        "`findings.csv` lists each (path, kind, score, given_label, suggested_label, other: the copied image); "
        "`relabel.csv` says what `--exclude relabel.csv` in the fine-tune does with each flagged training image "
        "(`drop`, `relabel` to `label`, or `keep`): edit it, then fine-tune with it.",
        "",
    ]
    for kind in KINDS:
        lines += [f"## {kind.replace('_', ' ')}s ({record['counts'][kind]})", "", f"![{kind}](audit_{kind}.png)", ""]
    return "\n".join(lines)


def write_audit_report(
    folder: str | os.PathLike, rows: Sequence[AuditImage], names: list[str], record: dict[str, Any],
    image_size: tuple[int, int],
) -> dict[str, Any]:  # fmt: skip
    """Write the audit's files into `folder` (a staging folder); returns `record` with the counts per kind."""
    folder = Path(folder)
    record = {**record, "counts": {kind: sum(r.finding.kind == kind for r in rows) for kind in KINDS}}
    (folder / "findings.csv").write_text(findings_csv(rows, names))
    (folder / "relabel.csv").write_text(relabel_csv(rows, names, record["quality"]["min_score"]))
    for kind in KINDS:
        plot_findings(rows, kind, names, image_size, folder / f"audit_{kind}.png")
    (folder / "report.md").write_text(report_markdown(record))
    (folder / "audit.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


__all__ = ["GRID_IMAGES", "OUTPUT_FILES", "AuditImage", "findings_csv", "plot_findings", "quality_lines",
           "relabel_csv", "report_markdown", "write_audit_report"]  # fmt: skip
