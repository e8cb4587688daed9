"""Exported graphs run by onnxruntime: `OnnxClassifier` (a graph with the preprocessing and task of the model it
came from, as a `Trained`), the graph's task read from its folder (`graph_task`), its logits against PyTorch's
(`logits_difference`: the check every export passes before it is moved into place) and the top-1 accuracy of each
graph against PyTorch's on the fine-tune's data (`compare_accuracy`, `export --evaluate`).

    graph = OnnxClassifier.from_folder("outputs/digits-onnx")  # model.onnx; INT8_FILE for the int8 graph
    logits = graph.logits(pixel_values)  # (batch, channels, height, width) -> (batch, num_labels)

A NaFlex graph (SigLIP 2) takes `data.input_spec.NAFLEX_INPUTS`; `from_folder` then builds a transform that makes
NaFlex batches (the input spec's, which also says which batches a graph takes: `check_graph_batch`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ...data.input_spec import check_graph_batch, is_naflex_batch
from ...tasks import task_for
from ...utils.run_record import PROCESSOR_FILE
from ..trained import Trained, load_trained

ONNX_FILE, INT8_FILE = "model.onnx", "model.int8.onnx"
# onnxruntime's input types -> numpy's, for feeding a batch whatever integer type its mask came in
_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}


class OnnxClassifier:
    """An exported graph run by onnxruntime on the CPU with the preprocessing of the model it came from: what
    `inference.iter_batches` and `evaluation.predict_dataset` take (`transform` and `logits`), as a `Trained`."""

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Any = None,
        threads: int | None = None,
        task: Any = None,  # the model's task (`vit_ft.tasks`): its probabilities, calibrated
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()  # as many as torch, for a fair race
        self.path, self.transform, self.task = Path(path), transform, task or task_for()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_types = {i.name: _NUMPY_TYPES.get(i.type, "float32") for i in self.session.get_inputs()}

    @classmethod
    def from_folder(
        cls, folder: str | os.PathLike, file: str = ONNX_FILE, threads: int | None = None,
        max_pixels: int | None = None,
    ) -> OnnxClassifier:
        """The graph `file` of an export folder with the preprocessing its files state (`preprocessor_config.json`'s
        normalisation, config.json's resolution, and for a NaFlex model its patch budget: the transform then makes
        NaFlex batches; kept as `preprocessing`) and its task (`graph_task`); `max_pixels` bounds the images the
        transform decodes (default `DEFAULT_MAX_PIXELS`)."""
        from ...data.input_spec import input_spec
        from ...model.configuration_vit_ft import ViTFTConfig
        from ...utils.limits import DEFAULT_MAX_PIXELS

        folder = Path(folder)
        config = ViTFTConfig.from_pretrained(folder)
        processor_file = folder / PROCESSOR_FILE
        settings = json.loads(processor_file.read_text(encoding="utf-8")) if processor_file.is_file() else None
        bound = DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels
        preprocessing = input_spec(settings, config, None, bound, str(folder))
        graph = cls(folder / file, preprocessing.eval_transform(), threads, graph_task(folder))
        graph.preprocessing = preprocessing
        return graph

    @property
    def naflex(self) -> bool:
        """Whether the graph takes NaFlex batches rather than `(batch, channels, height, width)` (by its inputs)."""
        return is_naflex_batch(self.input_types)

    def logits(self, pixel_values: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """`(batch, channels, height, width)` normalised pixels, or for a NaFlex graph a NaFlex batch (the transform's
        collated dict, or `Siglip2ImageProcessor`'s output) -> float32 logits `(batch, num_labels)`."""
        inputs = pixel_values if isinstance(pixel_values, dict) else {"pixel_values": pixel_values}
        check_graph_batch(self.path, self.input_types, inputs)
        feed = {name: _numpy(inputs[name], dtype) for name, dtype in self.input_types.items()}
        return torch.from_numpy(self.session.run(["logits"], feed)[0])


def _numpy(values: Any, dtype: str) -> Any:
    """A tensor (or array) as the contiguous numpy array of `dtype` that onnxruntime takes."""
    import numpy as np

    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    return np.ascontiguousarray(array, dtype=dtype)


def graph_task(folder: str | os.PathLike) -> Any:
    """The task of the graphs exported to `folder`, from its config.json: a single-label export has the
    calibration temperature folded into its head (`tasks.temperature.fold_temperature`), so its task divides by
    1; a multi-label one keeps its decision threshold."""
    from transformers import PretrainedConfig

    path = Path(folder) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return task_for(PretrainedConfig.from_dict(config), None)


def logits_difference(model: torch.nn.Module, path: Path, batches: list[dict[str, torch.Tensor]]) -> float:
    """Max |onnxruntime - PyTorch| logits over `batches` (`data.input_spec.check_batches`)."""
    graph, worst = OnnxClassifier(path), 0.0
    for batch in batches:
        with torch.inference_mode():
            expected = model(**batch).logits.float()
        worst = max(worst, (graph.logits(batch) - expected).abs().max().item())
    return worst


MULTI_LABEL_EVALUATION = (
    "{flag} compares top-1 accuracy, which a multi-label model ({model}: problem_type {problem_type}) does not "
    "have; leave {flag} out (every graph is checked against PyTorch's logits either way) and measure its mAP "
    "with vit-ft evaluate --model {model}."
)


REPORT_TAKES_PIXELS = (
    "--report times every runtime on batches of (batch, channels, height, width) pixels, which a {kind} model "
    "({model}: max_num_patches {budget}) does not take; leave --report out, and compare the graphs' accuracy "
    "with --evaluate SPLIT."
)


def check_evaluation(trained: Trained, flag: str = "--evaluate") -> None:
    """A ValueError when `--evaluate` (or `--report`) cannot run on the `trained` model: its task has no top-1
    accuracy (a multi-label model), or for `--report` it is a NaFlex model (the report's runtimes take fixed-size
    pixels). The command checks it before anything is exported."""
    task = trained.task
    if "accuracy" not in task.metric_names:
        raise ValueError(MULTI_LABEL_EVALUATION.format(model=trained.source, problem_type=task.problem_type, flag=flag))
    if flag == "--report":
        trained.preprocessing.refuse_patches(REPORT_TAKES_PIXELS, model=trained.source)


def load_for_export(model: str | os.PathLike | Trained) -> Trained:
    """`model` loaded for export on the CPU, a LoRA adapter merged (a `Trained` the command loaded: as it is)."""
    return model if isinstance(model, Trained) else load_trained(model, device="cpu", merge_lora=True)


def compare_accuracy(
    model: str | os.PathLike | Trained, folder: str | os.PathLike, split: str = "test", batch_size: int = 64
) -> dict[str, Any]:
    """Top-1 accuracy of the trained `model` (PyTorch; a path or Hub id, or the `Trained` model the command
    loaded) and of each graph exported to `folder` (onnxruntime) on the same images: `split` of the data the
    fine-tune recorded, each through the model's own eval transform; with how often each graph's top-1 equals
    PyTorch's. A multi-label model is a ValueError (`check_evaluation`)."""
    from ..evaluate.data import resolve_eval_data
    from ..evaluate.run import predict_dataset

    trained = load_for_export(model)
    check_evaluation(trained)
    data = resolve_eval_data(trained.origin, trained.id2label, split=split)
    runners = {"PyTorch": trained}
    for name, file in (("ONNX fp32", ONNX_FILE), ("ONNX int8", INT8_FILE)):
        if (Path(folder) / file).is_file():
            runners[name] = OnnxClassifier(Path(folder) / file, trained.transform, task=graph_task(folder))
    predictions = {
        name: predict_dataset(runner, data, batch_size, progress=False).predictions  # type: ignore[arg-type]
        for name, runner in runners.items()
    }
    labels = data.labels
    return {
        "split": data.description,
        "num_images": int(len(labels)),
        "accuracy": {name: float((p == labels).mean()) for name, p in predictions.items()},
        "agreement_with_pytorch": {
            name: float((p == predictions["PyTorch"]).mean())
            for name, p in predictions.items()
            if name != "PyTorch"
        },
    }


__all__ = [
    "INT8_FILE",
    "ONNX_FILE",
    "OnnxClassifier",
    "check_evaluation",
    "compare_accuracy",
    "graph_task",
    "load_for_export",
    "logits_difference",
]
