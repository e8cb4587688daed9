"""The runtimes of the deployment report (`vit-ft export --report`, `report.py`), each as a logits function of
`(batch, channels, height, width)` pixels on this host's CPU: PyTorch eager and under torch.compile, the exported
graphs under onnxruntime (fp32 and int8), and OpenVINO fp32 (converting model.onnx) and int8 (NNCF's
post-training quantisation); a runtime that cannot run here is a note saying why, and each int8 runtime's note
says which ops it quantises.

    runners, notes = build_runners(trained, "outputs/digits-onnx", calibration)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..trained import Trained
from .onnx_runtime import INT8_FILE, ONNX_FILE, OnnxClassifier

DEPLOY_HINT = "pip install 'vit-ft[deploy]'"
COMPILE_BACKEND = "inductor"  # torch.compile's default; a test sets "eager" (trace only, seconds)
PYTORCH = "PyTorch eager"

Runner = Callable[[torch.Tensor], torch.Tensor]  # (batch, channels, height, width) pixels -> (batch, labels) logits


def openvino_missing() -> list[str]:
    """The OpenVINO packages not importable here: openvino (both rows) and nncf (the int8 row)."""
    return [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]


def _openvino_runner(model: Any, threads: int) -> Runner:
    """An OpenVINO model compiled for the CPU in fp32 arithmetic: without the hint, OpenVINO runs bf16 on CPUs
    that have it, which is not the fp32 row (an int8 model's non-quantised ops stay fp32 the same way)."""
    import openvino as ov

    compiled = ov.Core().compile_model(
        model, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()

    def run(pixels: torch.Tensor) -> torch.Tensor:
        result = request.infer({0: pixels.detach().float().contiguous().numpy()})
        return torch.from_numpy(np.array(result[compiled.output(0)]))

    return run


def _openvino_int8(model: Any, calibration: list[torch.Tensor]) -> Any:
    """NNCF's post-training int8 quantisation of the OpenVINO `model`, its activation ranges from `calibration`
    batches; the transformer preset keeps LayerNorm, softmax and GELU in fp32 (they break in int8)."""
    import nncf

    dataset = nncf.Dataset(calibration, lambda pixels: pixels.numpy())
    nncf.set_log_level(logging.ERROR)  # its progress bars and advice are not the user's business
    with contextlib.redirect_stdout(io.StringIO()):
        return nncf.quantize(model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration))


def onnx_int8_ops(path: str | os.PathLike) -> dict[str, int]:
    """How many of the int8 graph's ops run in int8 and how many LayerNorm and softmax ops stay fp32 (by ONNX
    op type): the evidence for the report's "kept in fp32" line."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    types = [node.op_type for node in graph.node]
    counted = {t: types.count(t) for t in sorted(set(types))}
    return {t: n for t, n in counted.items() if t.endswith("Integer") or t.startswith("QLinear")
            or t in ("LayerNormalization", "Softmax")}  # fmt: skip


def openvino_int8_ops(model: Any) -> dict[str, int]:
    """What the quantised OpenVINO `model`'s FakeQuantize nodes feed, by op type (MatMul, Convolution; never
    MVN, its LayerNorm, or Softmax where those stay fp32)."""
    fed: dict[str, int] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() == "FakeQuantize":
            for target in op.output(0).get_target_inputs():
                name = target.get_node().get_type_name()
                fed[name] = fed.get(name, 0) + 1
    return fed


def openvino_fp32(onnx_file: str | os.PathLike, threads: int | None = None) -> Runner:
    """The fp32 OpenVINO runner of an exported graph (converted from `model.onnx`), as the report's row runs it."""
    import openvino as ov

    return _openvino_runner(ov.convert_model(str(onnx_file)), threads or torch.get_num_threads())


def _ops_note(ops: dict[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in ops.items())


def build_runners(
    trained: Trained,
    folder: str | os.PathLike,
    calibration: Callable[[], list[torch.Tensor]],
    threads: int | None = None,
    compile_backend: str | None = None,
) -> tuple[dict[str, Runner], dict[str, str]]:
    """Each runtime's logits function (the ONNX graphs in `folder`, OpenVINO converting model.onnx) and a note
    per runtime that cannot run here; `calibration` gives OpenVINO int8's calibration batches (called only when
    nncf is installed). Every runtime runs `threads` threads (default: torch's)."""
    threads = threads or torch.get_num_threads()
    folder = Path(folder)
    model = trained.model.eval()

    def eager(pixels: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(pixel_values=pixels).logits.float()

    compiled_model = torch.compile(model, backend=compile_backend or COMPILE_BACKEND, dynamic=False)

    def compiled(pixels: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return compiled_model(pixel_values=pixels).logits.float()

    runners: dict[str, Runner] = {PYTORCH: eager, "PyTorch compiled": compiled}
    notes: dict[str, str] = {}
    for name, file in (("onnxruntime fp32", ONNX_FILE), ("onnxruntime int8", INT8_FILE)):
        runners[name] = OnnxClassifier(folder / file, threads=threads).logits
    notes["onnxruntime int8"] = f"int8 graph ops: {_ops_note(onnx_int8_ops(folder / INT8_FILE))}"
    openvino, openvino_notes = openvino_runners(folder / ONNX_FILE, calibration, threads)
    return {**runners, **openvino}, {**notes, **openvino_notes}


def openvino_runners(
    onnx_file: str | os.PathLike, calibration: Callable[[], list[torch.Tensor]], threads: int
) -> tuple[dict[str, Runner], dict[str, str]]:
    """OpenVINO fp32 (converting the ONNX graph) and int8 (NNCF on `calibration`'s batches) on the CPU, with a
    note per row: why it cannot run here, or which ops its int8 quantises."""
    missing = openvino_missing()
    if "openvino" in missing:
        note = f"openvino is not installed here ({DEPLOY_HINT})"
        return {}, {"OpenVINO fp32": note, "OpenVINO int8": note}
    import openvino as ov

    ov_model = ov.convert_model(str(onnx_file))
    runners = {"OpenVINO fp32": _openvino_runner(ov_model, threads)}
    if "nncf" in missing:
        return runners, {"OpenVINO int8": f"nncf is not installed here ({DEPLOY_HINT}): OpenVINO fp32 only"}
    int8 = _openvino_int8(ov_model, calibration())
    runners["OpenVINO int8"] = _openvino_runner(int8, threads)
    return runners, {"OpenVINO int8": f"int8 inputs (FakeQuantize) of: {_ops_note(openvino_int8_ops(int8))}"}


__all__ = [
    "COMPILE_BACKEND",
    "PYTORCH",
    "Runner",
    "build_runners",
    "onnx_int8_ops",
    "openvino_int8_ops",
    "openvino_fp32",
    "openvino_missing",
    "openvino_runners",
]
