"""Export a trained model to ONNX for onnxruntime serving: `model.onnx` (fp32) with the image processor and the
labels beside it, and with `quantize="int8"` an onnxruntime dynamic-int8 copy, `model.int8.onnx`.

    export_onnx("outputs/digits", "outputs/digits-onnx", quantize="int8")

The graph takes `pixel_values` (batch, channels, height, width), normalised as `preprocessor_config.json` says,
and returns `logits` (batch, num_labels); `config.json` holds `id2label`. The batch is dynamic. Height and width
are dynamic too (the position embeddings are resampled inside the graph, as in PyTorch) when the export gives
PyTorch's logits at a second resolution; otherwise the graph is fixed at the fine-tuned resolution, and the
result says which. Every export is checked against PyTorch with onnxruntime before it is moved into place;
only the export's own files in the folder are replaced (`EXPORT_FILES`), the user's others are kept. A
multi-label model's `config.json` keeps its `problem_type` and `decision_threshold`: its label probabilities are
the sigmoid of the logits, each label predicted at or above its threshold. A single-label model's calibration
temperature is folded into the graph's head (`tasks.temperature.fold_temperature`; `config.json` records
`folded_temperature`): onnxruntime's softmax of its logits is the calibrated probability.

A NaFlex model (SigLIP 2; `config.max_num_patches`) is exported with its three inputs, `pixel_values` (batch,
patches, patch * patch * channels), `pixel_attention_mask` (batch, patches) and `spatial_shapes` (batch, 2), batch
and patch count dynamic, the position table resized per image inside the graph (the closed form of the antialiased
bilinear resize, `model.naflex.resize_positional_embeddings`), and checked on batches of several aspect ratios;
its folder carries transformers' `Siglip2ImageProcessor` with the model's budget, and
`onnx_runtime.OnnxClassifier.from_folder` feeds the graph NaFlex batches. Which inputs, traced how, through which
wrapper (`GraphLogits`) and with which processor are the input spec's (`data.input_spec`): this module holds no
branch on the kind of input. Running the graphs, their parity with PyTorch and `--evaluate`'s accuracy comparison
are `onnx_runtime`'s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...data.input_spec import GraphLogits, GraphTrace, graph_input_words, graph_traces
from ...metrics.multilabel import THRESHOLD_ATTRIBUTE
from ...tasks.temperature import fold_temperature
from ...utils.files import is_disk_full
from ...utils.output_dir import OutputFiles, check_output_dir
from ..trained import Trained
from .onnx_runtime import INT8_FILE, ONNX_FILE, load_for_export, logits_difference
from .processor import write_image_processor

logger = logging.getLogger("vit_ft")

QUANTIZE_CHOICES = ("int8",)
INSTALL_HINT = "pip install 'vit-ft[export]'"
# fp32 onnxruntime against PyTorch: the same arithmetic in another order (observed ~1e-6 on ViT-B logits)
FP32_TOLERANCE = 1e-4
# protobuf refuses a file over 2 GiB: larger weights go to model.onnx.data beside the graph
EXTERNAL_DATA_BYTES = 1 << 30
EXPORT_FILES = OutputFiles(
    "export",
    (ONNX_FILE, f"{ONNX_FILE}.data", INT8_FILE, f"{INT8_FILE}.data", "preprocessor_config.json",
     "config.json", "deployment.md", "deployment.json"),  # the last two: export --report (report.py)
    "an ONNX export",
    own_needs_overwrite=True,  # an earlier export is replaced only when asked
)


@dataclass
class OnnxExport:
    """What an export wrote and how it compares with PyTorch (max |logit difference| on random pixels)."""

    folder: Path
    files: list[str]
    image_size: tuple[int, int]  # the fine-tuned resolution (height, width)
    dynamic_size: bool  # height and width are graph inputs, not fixed
    fp32_difference: float
    int8_difference: float | None = None
    checked_sizes: list[tuple[int, int]] = field(default_factory=list)
    threshold: Any = None  # a multi-label model's decision threshold (its task's `threshold_summary`), else None
    max_num_patches: int | None = None  # the model's patch budget (its inputs are patches), else None
    inputs: tuple[str, ...] = ("pixel_values",)  # the graph's inputs, in order

    def summary(self) -> str:
        size = "any height and width (multiples of the patch size)" if self.dynamic_size else (
            f"{self.image_size[0]}x{self.image_size[1]} only (the fine-tuned resolution)")  # fmt: skip
        size = graph_input_words(self.inputs, self.max_num_patches) or size
        text = (f"Exported {', '.join(self.files)} to {self.folder}: dynamic batch, {size}; onnxruntime fp32 logits "
                f"within {self.fp32_difference:.1e} of PyTorch")  # fmt: skip
        if self.int8_difference is not None:
            text += f", int8 within {self.int8_difference:.2g}"
        if self.threshold is not None:
            text += (f"; multi-label: a label's probability is the sigmoid of its logit, predicted at or above "
                     f"config.json's {THRESHOLD_ATTRIBUTE}")  # fmt: skip
        return text + "."


def require_onnxruntime() -> None:
    """An OSError (the environment lacks something; the commands print it as one line) naming the install
    command unless onnx, onnxscript and onnxruntime are importable."""
    missing = [
        name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise OSError(
            f"the ONNX export needs onnx, onnxscript and onnxruntime; {', '.join(missing)} missing here. Install "
            f"them with: {INSTALL_HINT}"
        )


def check_export_dir(
    output_dir: str | os.PathLike, model: str | os.PathLike, overwrite: bool = False
) -> Path:
    """The export folder, refused before any model loads: a file, the model's own folder (or inside it), and a
    folder holding an earlier export or a file of the export's names unless `overwrite` (`EXPORT_FILES`; the
    folder's other files are kept either way)."""
    path = check_output_dir(output_dir, inputs=[model], holds=f"{ONNX_FILE} and its files")
    EXPORT_FILES.check(path, overwrite)
    return path


def _export_graph(model: torch.nn.Module, path: Path, trace: GraphTrace) -> None:
    """torch.onnx's dynamo exporter on `trace`'s inputs and dynamic axes (the CPU kernels step aside while it
    traces: `kernels.kernels_enabled`); its progress lines and warnings go to the debug log, not the user's
    terminal."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(), _quiet("torch.onnx"):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            GraphLogits(model).eval(),
            (),
            str(path),
            kwargs=trace.inputs,
            dynamo=True,
            input_names=list(trace.inputs),
            output_names=["logits"],
            dynamic_shapes=trace.dynamic_axes,
            external_data=size > EXTERNAL_DATA_BYTES,
            verbose=False,
        )
    logger.debug("torch.onnx.export: %s", out.getvalue())


def export_model(model: torch.nn.Module, path: Path) -> tuple[GraphTrace, float]:
    """Write `model` (a vit_ft classifier) as the ONNX graph `path`, checked against PyTorch with onnxruntime.

    Each way `data.input_spec.graph_traces` gives, in order, until one passes: exported, then kept if onnxruntime
    gives PyTorch's logits on its check batches (fixed-size models: dynamic height and width first, else the
    fine-tuned size; NaFlex models: three inputs, any patch count). Returns the trace kept and the graph's max
    logit difference from PyTorch; a graph further than FP32_TOLERANCE in every way is a ValueError.
    """
    traces = graph_traces(model.config)
    for trace in traces:
        try:
            _export_graph(model, path, trace)
            difference = logits_difference(model, path, trace.checks)
            if difference <= FP32_TOLERANCE:
                return trace, difference
            reason = f"its logits were {difference:.2g} from PyTorch's (tolerance {FP32_TOLERANCE})"
        except Exception as error:  # the exporter could not trace the resampling with symbolic sizes
            if is_disk_full(error, path.parent) or trace is traces[-1]:
                raise  # a full disk is not the trace's fault: the caller says it in the one full-disk line
            reason = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
        if trace is not traces[-1]:
            logger.info("The graph's inputs stay fixed (%s): the dynamic-size export failed its check (%s).",
                        ", ".join(f"{k} {tuple(v.shape[1:])}" for k, v in traces[-1].inputs.items()), reason)  # fmt: skip
            for leftover in path.parent.glob(f"{path.name}*"):
                leftover.unlink()
    raise ValueError(f"the ONNX graph's {reason}; the export is not written. Report it with the model's config.json.")


def quantize_int8(model: torch.nn.Module, source: Path, target: Path, checks: list[dict[str, torch.Tensor]]) -> float:
    """onnxruntime's dynamic int8 quantisation (weights int8, activations quantised per batch at run time) of the
    graph at `source`; returns its max logit difference from PyTorch (not a bound: int8 rounds)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings(), _quiet("root"):
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            use_external_data_format=(source.parent / f"{source.name}.data").exists(),
        )
    return logits_difference(model, target, checks)


@contextlib.contextmanager
def _quiet(name: str):
    """The logger `name` at ERROR for the block (onnxruntime's quantiser logs its advice on the root logger)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _config_dict(config: Any) -> dict[str, Any]:
    """The model's config as config.json states it (labels, sizes), without `auto_map`: no model code is here."""
    values = config.to_dict()
    values.pop("auto_map", None)
    return values


def export_onnx(
    model: str | os.PathLike | Trained,
    output_dir: str | os.PathLike,
    quantize: str | None = None,
    overwrite: bool = False,
    report: Callable[[Trained, Path], Any] | None = None,
) -> OnnxExport:
    """Export the trained `model` (a fine-tune output folder, LoRA adapter folder or Hub id, a LoRA adapter
    merged; or the `Trained` model the command loaded) to `output_dir`: model.onnx, preprocessor_config.json,
    config.json, and with `quantize="int8"` model.int8.onnx. Written to a hidden temporary folder and moved
    into place once every graph has been checked against PyTorch, replacing only the export's own files there
    (`EXPORT_FILES.staged`: an earlier export only with `overwrite`, the folder's other files kept); a missing
    onnxruntime or a bad folder fails before the model loads. `report(trained, staging)` then writes its files
    beside the graphs (`export --report`), moved into place with them."""
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"--quantize {quantize} is not one of {', '.join(QUANTIZE_CHOICES)}; leave it unset for fp32 only.")  # fmt: skip
    require_onnxruntime()
    given = model.origin.path or model.source if isinstance(model, Trained) else model
    output = check_export_dir(output_dir, given, overwrite)
    trained = load_for_export(model)
    origin = trained.origin
    model = fold_temperature(trained.model, trained.task)  # onnxruntime's softmax is then the calibrated one
    with EXPORT_FILES.staged(output, overwrite) as staging:
        trace, difference = export_model(model, staging / ONNX_FILE)
        int8 = quantize_int8(model, staging / ONNX_FILE, staging / INT8_FILE, trace.checks) if quantize else None
        write_image_processor(origin, staging, model.config)
        (staging / "config.json").write_text(json.dumps(_config_dict(model.config), indent=2) + "\n")
        if report is not None:
            report(trained, staging)
        files = sorted(p.name for p in staging.iterdir())
    threshold = trained.task.threshold_summary(trained.id2label)
    return OnnxExport(output, files, tuple(model.config.image_hw), trace.dynamic_size, difference, int8, trace.sizes,
                      threshold=threshold, max_num_patches=getattr(model.config, "max_num_patches", None),
                      inputs=tuple(trace.inputs))  # fmt: skip


__all__ = [
    "EXPORT_FILES",
    "OnnxExport",
    "QUANTIZE_CHOICES",
    "check_export_dir",
    "export_model",
    "export_onnx",
    "quantize_int8",
    "require_onnxruntime",
]
