"""What `vit-ft serve` runs: a model folder (or Hub id) under PyTorch, or an export folder's `model.onnx` under
onnxruntime or OpenVINO, as one `Served` value: the model as the inference loop takes it (`transform`, `logits`,
`task`), its labels, its OOD scorer (PyTorch only: the scores need the pooled features) and what `/info` says.

    served = load_served("outputs/digits", "torch")   # checked and loaded; the server's worker loads it again
    served.info["labels"], served.scorer.note()
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...data.images import DEFAULT_MAX_PIXELS
from ..export.onnx_runtime import ONNX_FILE, OnnxClassifier
from ..export.runtimes import DEPLOY_HINT
from ..ood import OODScorer
from ..trained import load_trained
from .payload import RUNTIMES

EXPORT_HINT = "vit-ft export --model MODEL --output_dir DIR writes one"


@dataclass
class Served:
    """The served model: `runnable` (a `Trained` or an `OnnxClassifier`: what `inference.iter_batches` runs), its
    `task` and `id2label` (what `predict.run.batch_predictions` reads), the OOD scorer (None: no score), and the
    /info record."""

    runnable: Any
    id2label: dict[int, str]
    scorer: OODScorer | None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> Any:
        return self.runnable.task


def check_runtime(model: str, runtime: str) -> None:
    """A ValueError naming the fix when `runtime` cannot serve `model` here: an unknown runtime, an ONNX runtime for
    a folder without `model.onnx`, or a runtime package that is not installed. Cheap: nothing is loaded."""
    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime {runtime} is not one of {', '.join(RUNTIMES)}.")
    if runtime == "torch":
        if (Path(model) / ONNX_FILE).is_file() and not _has_torch_weights(Path(model)):
            raise ValueError(
                f"{model} is an export folder ({ONNX_FILE}, no PyTorch weights); pass --runtime onnx or --runtime "
                "openvino, or serve the model folder it was exported from."
            )
        return
    if not (Path(model) / ONNX_FILE).is_file():
        raise ValueError(
            f"--runtime {runtime} serves an export folder holding {ONNX_FILE}; {model} has none ({EXPORT_HINT}), "
            "or pass --runtime torch."
        )
    package = "onnxruntime" if runtime == "onnx" else "openvino"
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"--runtime {runtime} needs {package}, which is not installed here ({DEPLOY_HINT}).")


def _has_torch_weights(folder: Path) -> bool:
    """Whether `folder` holds weights PyTorch loads (a model's, sharded or not, or a LoRA adapter's)."""
    return (
        any(folder.glob("*.safetensors"))
        or any(folder.glob("pytorch_model*.bin"))
        or any((folder / name).is_file() for name in ("adapter_config.json", "adapter/adapter_config.json"))
    )


def openvino_logits(graph: OnnxClassifier) -> Callable[[Any], torch.Tensor]:
    """The exported graph of `graph` compiled by OpenVINO for the CPU in fp32 (without the hint it runs bf16 where
    the CPU has it), as `graph.logits` takes its inputs: plain pixels, or a NaFlex batch's three inputs by name."""
    import numpy as np
    import openvino as ov

    settings = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    compiled = ov.Core().compile_model(ov.convert_model(str(graph.path)), "CPU", settings)
    request, types = compiled.create_infer_request(), dict(graph.input_types)

    def logits(pixel_values: Any) -> torch.Tensor:
        inputs = pixel_values if isinstance(pixel_values, dict) else {"pixel_values": pixel_values}
        feed = {name: np.ascontiguousarray(torch.as_tensor(inputs[name]).cpu().numpy(), dtype=dtype)
                for name, dtype in types.items()}  # fmt: skip
        return torch.from_numpy(np.array(request.infer(feed)[compiled.output(0)]))

    return logits


def model_revision(folder: Path | None, name: str) -> str:
    """The model's revision: the first 12 hex digits of the SHA-256 of its weights files (`*.safetensors`,
    `*.onnx`, the adapter's too), so that a client can tell which weights answered; a Hub id's is its name and the
    commit its files were downloaded at (the cache's snapshot: `hub:ID@COMMIT`, the first 12 hex digits)."""
    if folder is None:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")  # loading read it: .../snapshots/<commit>/config.json
        return f"hub:{name}@{Path(cached).parent.name[:12]}" if isinstance(cached, str) else f"hub:{name}"
    files = sorted(p for pattern in ("*.safetensors", "*.onnx", "adapter/*.safetensors") for p in folder.glob(pattern))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def _versions(runtime: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    names = ["vit-ft", "torch", "transformers", "litserve", "fastapi", "uvicorn"]
    names += {"onnx": ["onnxruntime"], "openvino": ["openvino"]}.get(runtime, [])
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def _info(served: Served, model: str, runtime: str, folder: Path | None, preprocessing: Any, ood: str) -> dict:
    """What GET /info says of the model (LitServe's /info shows it under "model")."""
    task = served.task
    return {
        "model": model,
        "revision": model_revision(folder, model),
        "runtime": runtime,
        "task": task.problem_type,
        "labels": [served.id2label[i] for i in sorted(served.id2label)],
        "input": preprocessing.record(),
        "calibration": {"temperature": getattr(task, "temperature", None),
                        "threshold": task.threshold_summary(served.id2label)},  # fmt: skip
        "ood": ood,
        "versions": _versions(runtime),
    }


def load_served(
    model: str, runtime: str = "torch", device: str | None = None, bf16: str | bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Served:  # fmt: skip
    """`model` loaded for `runtime` (checked first: `check_runtime`), with its /info record. PyTorch reads any
    folder or Hub id `load_trained` reads, with its feature bank's OOD score; onnx / openvino read an export
    folder (the calibration temperature is folded into its head; a NaFlex graph's three inputs too), on the CPU."""
    check_runtime(model, runtime)
    path = Path(model)
    if runtime == "torch":
        trained = load_trained(model, device=device, max_pixels=max_pixels, bf16=bf16)
        scorer = OODScorer.of(trained)
        served = Served(trained, trained.id2label, scorer if scorer.bank is not None else None)
        folder = trained.origin.path
        served.info = _info(served, model, runtime, folder, trained.preprocessing, scorer.note())
        return served
    from ...model.configuration_vit_ft import ViTFTConfig

    graph = OnnxClassifier.from_folder(path, max_pixels=max_pixels)
    if runtime == "openvino":
        graph.logits = openvino_logits(graph)  # the same transform and task, OpenVINO's arithmetic
    id2label = ViTFTConfig.from_pretrained(path).id2label
    served = Served(graph, {int(k): str(v) for k, v in id2label.items()}, None)
    note = (f"No out-of-distribution score: the {runtime} runtime gives logits only; serve the model folder with "
            "--runtime torch for the score.")  # fmt: skip
    served.info = _info(served, model, runtime, path, graph.preprocessing, note)
    return served


__all__ = ["RUNTIMES", "Served", "check_runtime", "load_served", "model_revision"]
