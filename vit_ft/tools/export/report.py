"""The deployment report (`vit-ft export --report`): one table with a row per runtime that can serve the model
on this host's CPU (PyTorch eager and under torch.compile, onnxruntime fp32 and int8, OpenVINO fp32 and int8),
each with its top-1 accuracy on the user's test split, how often its top-1 equals PyTorch's, the median latency
of one image, the images/s of a batch of 32 and the recommendation. Written as `deployment.md` and
`deployment.json` into the export folder, beside the graphs it measured.

    rows = measure_runtimes(trained, "outputs/digits-onnx", split="test")

int8 is recommended only where it is faster than its own fp32 (both at batch 1 and at batch 32) and its accuracy
is within 0.5 points of it (`recommend_int8`). Quantisation keeps LayerNorm and softmax in fp32: onnxruntime's
dynamic int8 quantises only the MatMul/Gemm weights and activations, and NNCF's transformer preset (OpenVINO
int8) leaves LayerNorm, softmax and the GELU out. OpenVINO needs `pip install 'vit-ft[deploy]'` (openvino, and
nncf for its int8 row); where absent, its rows say so in one line (the runtimes: `runtimes.py`). Timings are medians of repeats after
warm-up calls, interleaved so that a busy machine slows every runtime alike; they are this host's, not a bound.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...utils.hardware import cpu_model
from ...utils.timing import interleave
from ..trained import Trained
from .formats import REPORT_REPEATS, REPORT_WARMUP
from .runtimes import PYTORCH, Runner, build_runners

logger = logging.getLogger("vit_ft")

REPORT_FILES = ("deployment.md", "deployment.json")
INT8_MAX_ACCURACY_DROP = 0.005  # 0.5 points of top-1: the issue's bound for recommending int8
LATENCY_BATCH, THROUGHPUT_BATCH = 1, 32
CALIBRATION_IMAGES = 300  # NNCF's default subset size: enough for stable activation ranges on ViT
# each int8 runtime and the fp32 runtime it must beat
INT8_OF = {"onnxruntime int8": "onnxruntime fp32", "OpenVINO int8": "OpenVINO fp32"}


@dataclass
class RuntimeRow:
    """One runtime's line of the report; a runtime that could not run has None values and a `note` saying why."""

    runtime: str
    accuracy: float | None = None  # top-1 on the split
    agreement: float | None = None  # fraction of images whose top-1 equals PyTorch eager's
    latency_ms: float | None = None  # median of one image's latency (batch 1)
    throughput: float | None = None  # images/s at batch 32 (32 / median time of a batch)
    recommended: str = ""
    note: str = ""


def recommend_int8(int8: RuntimeRow, fp32: RuntimeRow) -> tuple[bool, str]:
    """Whether the `int8` row is recommended over its `fp32` row, and why in a few words: only where it is
    faster at batch 1 (latency) AND at batch 32 (throughput) AND its accuracy is within 0.5 points of fp32's."""
    values = (int8.accuracy, fp32.accuracy, int8.latency_ms, fp32.latency_ms, int8.throughput, fp32.throughput)
    if any(value is None for value in values):
        return False, "not measured"
    change = (int8.accuracy - fp32.accuracy) * 100  # type: ignore[operator]
    if int8.latency_ms >= fp32.latency_ms or int8.throughput <= fp32.throughput:  # type: ignore[operator]
        return False, f"no: not faster than {fp32.runtime}"
    if -change > INT8_MAX_ACCURACY_DROP * 100 + 1e-9:
        return False, f"no: {-change:.2f} points below {fp32.runtime}"
    return True, f"yes: faster than {fp32.runtime}, accuracy {change:+.2f} points"


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------


def _padded(runner: Runner, pixels: torch.Tensor, batch_size: int) -> torch.Tensor:
    """`runner` on `pixels` padded with zeros to `batch_size` images (one shape: torch.compile compiles once)."""
    short = batch_size - len(pixels)
    if short > 0:
        pixels = torch.cat([pixels, pixels.new_zeros(short, *pixels.shape[1:])])
    return runner(pixels)[: batch_size - short]


def split_predictions(
    trained: Trained, runners: dict[str, Runner], split: str, batch_size: int = THROUGHPUT_BATCH
) -> tuple[str, np.ndarray, dict[str, np.ndarray]]:
    """Every runtime's top-1 on the same decoded images of `split` of the data the fine-tune recorded (each image
    decoded once, through the model's eval transform; one that does not decode is skipped for all): the split's
    description, its labels and each runtime's predictions."""
    from ..evaluate.data import resolve_eval_data
    from ..inference import iter_batches

    data = resolve_eval_data(trained.origin, trained.id2label, split=split)
    predictions: dict[str, list[np.ndarray]] = {name: [] for name in runners}
    rows: list[int] = []

    def forward(pixels: torch.Tensor) -> torch.Tensor:
        for name, runner in runners.items():
            predictions[name].append(_padded(runner, pixels, batch_size).argmax(-1).numpy())
        return pixels[:, :0, 0, 0]  # nothing to hand back: the predictions are collected here

    for batch in iter_batches(trained, data.dataset["image"], batch_size, desc="Deployment", progress=False,
                              forward=forward):  # fmt: skip
        rows.extend(batch.start + i for i in batch.decoded)
    if not rows:
        raise ValueError(f"None of the {len(data)} images of {data.description} decodes; nothing to measure.")
    labels = np.asarray(data.labels)[np.asarray(rows, dtype=np.int64)]
    return data.description, labels, {name: np.concatenate(p) for name, p in predictions.items()}


def time_runners(
    runners: dict[str, Runner], pixels: torch.Tensor, warmup: int, repeats: int
) -> dict[str, float]:
    """Median seconds per call of each runner on `pixels`: `warmup` untimed calls each (the first compiles or
    faults in memory), then `repeats` rounds calling every runner once, the order rotated each round
    (`utils.timing.interleave`)."""
    times = interleave({name: functools.partial(runner, pixels) for name, runner in runners.items()}, warmup, repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def measure_runtimes(
    trained: Trained,
    folder: str | os.PathLike,
    split: str = "test",
    warmup: int = REPORT_WARMUP,
    repeats: int = REPORT_REPEATS,
    threads: int | None = None,
    compile_backend: str | None = None,
) -> dict[str, Any]:
    """The report of the `trained` model exported to `folder` (model.onnx and model.int8.onnx): a row per
    runtime (`RuntimeRow`) with accuracy and agreement on `split`, latency and throughput from random pixels at
    the model's resolution, and the recommendation; with the host and settings it was measured with."""
    config = trained.model.config
    generator = torch.Generator().manual_seed(0)

    def calibration() -> list[torch.Tensor]:  # the training split, never the one evaluated
        from ..evaluate.data import resolve_eval_data
        from ..inference import iter_batches

        data = resolve_eval_data(trained.origin, trained.id2label, split="train", max_samples=CALIBRATION_IMAGES)
        return [b.outputs for b in iter_batches(trained, data.dataset["image"], 32, progress=False,
                                                forward=lambda pixels: pixels)]  # fmt: skip

    runners, notes = build_runners(trained, folder, calibration, threads, compile_backend)
    description, labels, predictions = split_predictions(trained, runners, split)
    timings = {}
    for batch in (LATENCY_BATCH, THROUGHPUT_BATCH):
        pixels = torch.randn(batch, config.num_channels, *config.image_hw, generator=generator)
        timings[batch] = time_runners(runners, pixels, warmup, repeats)
    rows = {}
    for name in (PYTORCH, "PyTorch compiled", "onnxruntime fp32", "onnxruntime int8", "OpenVINO fp32", "OpenVINO int8"):  # fmt: skip
        if name not in runners:
            rows[name] = RuntimeRow(name, recommended="no: not run", note=notes[name])
            continue
        rows[name] = RuntimeRow(
            name,
            note=notes.get(name, ""),
            accuracy=float((predictions[name] == labels).mean()),
            agreement=float((predictions[name] == predictions[PYTORCH]).mean()),
            latency_ms=timings[LATENCY_BATCH][name] * 1000,
            throughput=THROUGHPUT_BATCH / timings[THROUGHPUT_BATCH][name],
        )
    for int8, fp32 in INT8_OF.items():
        if rows[int8].accuracy is not None:
            rows[int8].recommended = recommend_int8(rows[int8], rows[fp32])[1]
    best = _fastest(rows)
    if best is not None:
        rows[best].recommended = (rows[best].recommended + "; " if rows[best].recommended else "") + "fastest"
    return {
        "model": str(trained.source),
        "split": description,
        "num_images": int(len(labels)),
        "image_size": list(config.image_hw),
        "warmup": warmup,
        "repeats": repeats,
        "threads": threads or torch.get_num_threads(),
        "host": host_info(),
        "rows": [asdict(row) for row in rows.values()],
        "recommended": best,
    }


def _fastest(rows: dict[str, RuntimeRow]) -> str | None:
    """The runtime with the most images/s at batch 32 among fp32 rows and recommended int8 rows."""
    eligible = [
        row for row in rows.values()
        if row.throughput is not None and (row.runtime not in INT8_OF or row.recommended.startswith("yes"))
    ]  # fmt: skip
    return max(eligible, key=lambda row: row.throughput).runtime if eligible else None  # type: ignore[arg-type,return-value]


def host_info() -> dict[str, Any]:
    """What the timings were measured on."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("torch", "onnxruntime", "openvino", "nncf"):
        with contextlib.suppress(PackageNotFoundError):
            versions[name] = version(name)
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        **versions,
    }


# ---------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def report_markdown(report: dict[str, Any]) -> str:
    """The report as deployment.md: the settings, the table, the notes."""
    host = report["host"]
    height, width = report["image_size"]
    lines = [
        "# Deployment report",
        "",
        f"Model {report['model']} at {height}x{width} px; accuracy on {report['split']} ({report['num_images']} "
        f"images); agreement: top-1 equal to {PYTORCH}'s. Latency: median of {report['repeats']} calls at batch "
        f"{LATENCY_BATCH}; throughput: batch {THROUGHPUT_BATCH}, median of {report['repeats']} (after "
        f"{report['warmup']} warm-up calls each), random pixels, {report['threads']} thread(s), on "
        f"{host['cpu']} ({host['logical_cpus']} logical CPUs), {host['platform']}.",
        "",
        "| runtime | accuracy | agreement | latency batch 1 (ms) | images/s batch 32 | recommended |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['runtime']} | {_cell(row['accuracy'], '.4f')} | {_cell(row['agreement'], '.1%')} | "
            f"{_cell(row['latency_ms'], '.2f')} | {_cell(row['throughput'], '.1f')} | {row['recommended']} |"
        )
    lines += ["", f"int8 is recommended only where it is faster than its fp32 at batch {LATENCY_BATCH} and "
              f"{THROUGHPUT_BATCH} and within {INT8_MAX_ACCURACY_DROP * 100:g} points of its accuracy; LayerNorm "
              "and softmax stay fp32 in both int8 graphs."]  # fmt: skip
    lines += [f"- {row['runtime']}: {row['note']}" for row in report["rows"] if row["note"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], folder: str | os.PathLike) -> None:
    """deployment.md and deployment.json into `folder` (the export's staging folder: moved into place with it)."""
    folder = Path(folder)
    (folder / REPORT_FILES[0]).write_text(report_markdown(report))
    (folder / REPORT_FILES[1]).write_text(json.dumps(report, indent=2) + "\n")


class DeploymentReport:
    """`export_onnx`'s `report` hook for `export --report SPLIT`: measures the staged graphs (`measure_runtimes`)
    and writes deployment.md and deployment.json beside them; `result` holds the report afterwards."""

    def __init__(self, split: str = "test", **settings: Any) -> None:
        self.split, self.settings, self.result = split, settings, None

    def check(self, trained: Trained) -> None:
        """The split resolves (a ValueError naming the recorded splits otherwise), before anything is exported."""
        from ..evaluate.data import resolve_eval_data

        resolve_eval_data(trained.origin, trained.id2label, split=self.split)

    def __call__(self, trained: Trained, folder: Path) -> None:
        self.result = measure_runtimes(trained, folder, self.split, **self.settings)
        write_report(self.result, folder)

    def summary(self) -> str:
        """The report in one line for the terminal."""
        report = self.result or {}
        return (f"Deployment report on {report['num_images']} images of {report['split']}: "
                f"{len(report['rows'])} runtimes in deployment.md, fastest recommended {report['recommended']}.")  # fmt: skip


__all__ = [
    "DeploymentReport",
    "INT8_MAX_ACCURACY_DROP",
    "REPORT_FILES",
    "RuntimeRow",
    "measure_runtimes",
    "recommend_int8",
    "report_markdown",
    "split_predictions",
    "time_runners",
    "write_report",
]
