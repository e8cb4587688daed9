"""The "onnx" section: `vit-ft export`'s graphs under onnxruntime (fp32, and onnxruntime's dynamic int8), and
under OpenVINO (fp32, and NNCF int8 calibrated on random pixels) where `vit-ft[deploy]` is installed, against our
PyTorch model eager and under torch.compile, inference on the same pixels, interleaved in one run. What a user
who serves the export on a CPU gains or loses against serving the PyTorch model (`vit-ft export --report` adds
accuracy on the user's data; ViT-B at 224 and 384 px in one table: `python -m benchmarks.deployment`)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from pathlib import Path

import torch

from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.tools.export.onnx import export_model, quantize_int8
from vit_ft.tools.export.onnx_runtime import OnnxClassifier
from vit_ft.tools.export.runtimes import openvino_runners
from vit_ft.utils.timing import interleave

from .common import BenchmarkSettings, Row, throughput_row
from .compiled import OURS
from .workloads import infer, random_batch

logger = logging.getLogger(__name__)

CONTENDERS = {"onnx fp32": "onnxruntime fp32", "onnx int8": "onnxruntime int8 (dynamic)",
              "OpenVINO fp32": "OpenVINO fp32", "OpenVINO int8": "OpenVINO int8 (NNCF)"}  # fmt: skip
REFERENCES = {"ours": f"{OURS} eager", "ours compiled": f"{OURS} + torch.compile"}


def onnx_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript", "onnxruntime"))


def bench_onnx(
    settings: BenchmarkSettings, ours: ViTFTForImageClassification, folder: str | os.PathLike
) -> list[Row]:
    """images/s of onnxruntime fp32 and int8 against ours eager and compiled (fp32, `infer_batch_size`); one row
    per pair. onnxruntime runs as many threads as torch. The graphs are written under `folder`."""
    graphs = Path(folder) / "onnx"
    graphs.mkdir(exist_ok=True)
    trace, difference = export_model(ours, graphs / "model.onnx")
    dynamic = trace.dynamic_size
    int8_difference = quantize_int8(ours, graphs / "model.onnx", graphs / "model.int8.onnx", trace.checks)
    batch = settings.infer_batch_size
    pixels, _ = random_batch(ours.config, batch, settings.seed)
    compiled = torch.compile(ours, backend=settings.compile_backend)
    sessions = {"onnx fp32": OnnxClassifier(graphs / "model.onnx"), "onnx int8": OnnxClassifier(graphs / "model.int8.onnx")}  # fmt: skip
    openvino, notes = openvino_runners(  # none without openvino: its rows are left out, the log says why
        graphs / "model.onnx", lambda: [random_batch(ours.config, batch, settings.seed + 1)[0]], torch.get_num_threads()
    )
    for name, note in notes.items():
        if name not in openvino:
            logger.info("onnx: no %s row: %s", name, note)
    calls = {
        "ours": functools.partial(infer, ours, pixels, None),
        "ours compiled": functools.partial(infer, compiled, pixels, None),
        **{name: functools.partial(session.logits, pixels) for name, session in sessions.items()},
        **{name: functools.partial(run, pixels) for name, run in openvino.items()},
    }
    logger.info("onnx, inference, fp32: %s", ", ".join(calls))
    times = interleave(calls, max(settings.warmup, 1), settings.rounds)  # the first compiled call compiles
    size = f"{ours.config.image_hw[0]} px"
    rows = []
    for name, candidate in CONTENDERS.items():
        if name not in calls:
            continue
        for reference, reference_name in REFERENCES.items():
            row = throughput_row(
                "onnx",
                f"inference, {size}, batch {batch}: {candidate} against PyTorch fp32 "
                f"{'eager' if reference == 'ours' else f'compiled ({settings.compile_backend})'}",
                batch,
                (candidate, times[name]),
                (reference_name, times[reference]),
            )
            if reference == "ours" and name.startswith("onnx"):  # once per graph: its logits against PyTorch's
                gap = difference if name == "onnx fp32" else int8_difference
                fixed = "" if dynamic else "; graph fixed at the model's resolution"
                row.note = f"max |logit difference| from PyTorch {gap:.2g}{fixed}"
            rows.append(row)
    return rows
