"""The report: a Markdown table (the machine, the settings, one line per row, then the notes) and the JSON."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any


def _fmt(value: float) -> str:
    if value >= 100_000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _header(result: dict[str, Any]) -> list[str]:
    """The machine and the settings, as two paragraphs."""
    machine, settings = result["machine"], result["settings"]
    load = result["load_average"]
    overrides = f" {settings['overrides']}" if settings["overrides"] else ""
    return [
        f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {machine['torch_threads']} torch "
        f"threads, {machine['cpu_capability']}, oneDNN bf16: {machine['onednn_bf16']}; Python "
        f"{machine['python']}, torch {machine['torch']}, transformers {machine['transformers']}, Pillow "
        f"{machine['pillow']}.",
        "",
        *_kernels(result),
        f"Settings: ViT-{settings['variant']}/{settings['patch_size']} at {settings['image_size']} px"
        f"{overrides}, {settings['num_labels']} classes, warm-up {settings['warmup']}, "
        f"{settings['rounds']} interleaved rounds. Load average (1 min) {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after; {result['elapsed_s'] / 60:.1f} min.",
        "",
    ]


def _kernels(result: dict[str, Any]) -> list[str]:
    """The CPU flags and the kernels each precision's CPU rows ran, as a paragraph (none in older results)."""
    kernels = result.get("kernels") or {}
    if not kernels:
        return []
    flags = " ".join(result["machine"].get("cpu_flags") or []) or "none of avx2 avx512f avx512_bf16 amx_bf16"
    ran = "; ".join(f"{name}: {record['kernels']} ({record['reason']})" for name, record in kernels.items())
    return [f"CPU flags: {flags}. Kernels of the CPU rows: {ran}.", ""]


def to_markdown(result: dict[str, Any]) -> str:
    """The machine, the settings and one table row per measurement."""
    lines = [
        *_header(result),
        "| section | measurement | candidate | reference | ratio | per-round ratios | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        spread = "" if row["ratio_low"] is None else f"{row['ratio_low']:.2f}-{row['ratio_high']:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(
            f"| {row['section']} | {row['measurement']} | {row['candidate']}: {_fmt(row['candidate_value'])} "
            f"{row['unit']} | {row['reference']}: {_fmt(row['reference_value'])} {row['unit']} | "
            f"{row['ratio']:.3g}x | {spread} | {row['target'] or ''} | {met} |"
        )
    notes = [f"{row['section']}, {row['candidate']}: {row['note']}" for row in result["rows"] if row["note"]]
    lines.extend(["", *(f"- {note}" for note in [*result["notes"], *notes])])
    return "\n".join(lines) + "\n"


def write_results(result: dict[str, Any], output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """benchmark.md and benchmark.json in `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    markdown, data = output_dir / "benchmark.md", output_dir / "benchmark.json"
    markdown.write_text(to_markdown(result), encoding="utf-8")
    data.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return markdown, data


def summarize_runs(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of several separate runs merged by measurement: the median ratio, the lowest and highest run's, and
    a target met only if the run least in its favour meets it (the lowest ratio for ">=", the highest for "<=")."""
    merged: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for result in results:
        for row in result["rows"]:
            key = (row["section"], row["measurement"], row["candidate"], row["reference"])
            merged.setdefault(key, []).append(row)
    rows = []
    for (section, measurement, candidate, reference), runs in merged.items():
        ratios = sorted(row["ratio"] for row in runs)
        target = runs[0]["target"]
        met = None
        if target is not None:
            bound = float(target.split()[1])
            met = ratios[0] >= bound if target.startswith(">=") else ratios[-1] <= bound
        rows.append(
            {
                "section": section,
                "measurement": measurement,
                "candidate": candidate,
                "reference": reference,
                "runs": len(runs),
                "ratio_median": statistics.median(ratios),
                "ratio_low": ratios[0],
                "ratio_high": ratios[-1],
                "ratios": [row["ratio"] for row in runs],
                "target": target,
                "met": met,
            }
        )
    return {"runs": len(results), "machine": results[0]["machine"], "rows": rows, "results": results}


def repeated_markdown(summary: dict[str, Any]) -> str:
    """One line per measurement: the median ratio over the runs with the lowest and highest beside it."""
    machine = summary["machine"]
    loads = ", ".join(f"{r['load_average']['before'][0]:.1f}" for r in summary["results"])
    lines = [
        f"{summary['runs']} separate runs on {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch "
        f"{machine['torch']}; load average (1 min) at each start: {loads}. A target counts as met only if the run "
        "least in its favour meets it.",
        "",
        "| section | measurement | candidate / reference | median ratio | lowest-highest run | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in summary["rows"]:
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(
            f"| {row['section']} | {row['measurement']} | {row['candidate']} / {row['reference']} | "
            f"{row['ratio_median']:.3g}x | {row['ratio_low']:.2f}-{row['ratio_high']:.2f} | {row['target'] or ''} | "
            f"{met} |"
        )
    return "\n".join(lines) + "\n"
