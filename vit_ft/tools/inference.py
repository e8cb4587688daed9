"""One way to load a trained model for inference, and the one batched inference loop.

`load_classifier` takes a vit_ft folder (full or merged model), a LoRA adapter folder (or an output folder
with `adapter/`), or a Hub id, and returns the model with its evaluation preprocessing, label names and run
record; peft is imported only for an adapter. predict, evaluate, inspect, push and the demo all load through
it. `iter_batches` runs a model over many images a batch at a time, turning an image that does not decode
into an error for that image instead of a crash.

    classifier = load_classifier("outputs/digits")
    for batch in iter_batches(classifier, ["a.png", "b.png"]):
        batch.outputs  # (decoded images, num_labels) logits
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from tqdm.auto import tqdm

from ..data.images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from ..data.transforms import ImageClassificationTransform, build_transforms
from ..kernels import cpuinfo
from ..model.checkpoint_formats import checkpoint_normalization
from ..model.configuration_vit_ft import nearest_multiple, to_2tuple
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.run_record import (
    ADAPTER_DIR,
    PROCESSOR_FILE,
    RUN_RECORD_FILE,
    is_adapter_folder,
    read_run_record,
    run_folder,
)

logger = logging.getLogger("vit_ft")


@dataclass(frozen=True)
class Preprocessing:
    """The evaluation geometry and normalisation: resize + centre crop to `image_size`, then normalise."""

    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = VIT_MEAN
    std: tuple[float, ...] = VIT_STD
    rescale_factor: float = RESCALE_FACTOR
    resample: int = Image.Resampling.BICUBIC  # what vit_ft fine-tunes and evaluates with
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def transform(self) -> ImageClassificationTransform:
        """The eval transform of `vit_ft.data.transforms.build_transforms` with these settings."""
        return build_transforms(
            self.image_size,
            mean=self.mean,
            std=self.std,
            train=False,
            rescale_factor=self.rescale_factor,
            resample=self.resample,
            max_pixels=self.max_pixels,
        )


@dataclass
class Classifier:
    """A loaded image classifier: the model (in eval mode, on `device`), its preprocessing, label names, and
    the fine-tune's run record when the model is a local output folder."""

    model: torch.nn.Module
    preprocessing: Preprocessing
    id2label: dict[int, str]
    source: str
    device: torch.device
    run_record: dict[str, Any] | None = None
    bf16: bool = False  # run the model under bf16 autocast (see `use_bf16`)
    transform: ImageClassificationTransform = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.transform = self.preprocessing.transform()

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    def autocast(self) -> torch.autocast:
        """bf16 autocast on the model's device when `bf16`, else a no-op context."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.inference_mode()
    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, channels, height, width)` normalised pixels -> float32 logits `(batch, num_labels)` on CPU."""
        with self.autocast():
            out = self.model(pixel_values=pixel_values.to(self.device))
        return out.logits.float().cpu()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


BF16_CHOICES = ("auto", "true", "false")


def bf16_helps(device: torch.device) -> bool:
    """True where bf16 autocast was measured to run inference faster: CUDA GPUs with bf16, and AMD CPUs with
    native bf16 products (ViT-B/16 at 224, batch 8, on an AMD EPYC with AVX512_BF16: 16.1 images/s against 9.1
    in float32). On an Intel Xeon that reports AVX512_BF16 too, bf16 ran at 4.2 images/s against 7.0 in float32,
    kernels on or off (BENCHMARKS.md), so elsewhere float32 stays."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(supported is not None and supported()) and cpuinfo("vendor_id") == "AuthenticAMD"
    return False


def use_bf16(setting: str | bool, device: torch.device) -> bool:
    """Whether to run under bf16 autocast: "auto" where `bf16_helps`, "true" / "false" (or a bool) as said."""
    if isinstance(setting, bool):
        return setting
    if setting not in BF16_CHOICES:
        raise ValueError(f"--bf16 {setting} must be one of {', '.join(BF16_CHOICES)}.")
    return bf16_helps(device) if setting == "auto" else setting == "true"


# "name" or "namespace/name" (huggingface_hub's validate_repo_id); anything else can only be a local path
HUB_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?")


def looks_like_path(model: str | os.PathLike) -> bool:
    """True when `model` cannot be a Hub id: absolute, `.`/`~`-relative, or not of the `namespace/name` shape."""
    text = os.fspath(model)
    return os.path.isabs(text) or text.startswith((".", "~")) or HUB_ID.fullmatch(text) is None


def check_model_path(model: str | os.PathLike) -> None:
    """Raise FileNotFoundError naming `model` as a path when it is one (see `looks_like_path`) and is missing,
    before transformers reports it as a malformed Hub id."""
    path = Path(model).expanduser()
    if not path.exists() and looks_like_path(model):
        raise FileNotFoundError(
            f"--model {model}: no such folder; pass a model folder, a LoRA adapter folder or a Hub id."
        )
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(
            f"--model {model} is a file; pass the folder that holds config.json (a model folder), "
            "a LoRA adapter folder or a Hub id."
        )


def _from_pretrained(name: str | os.PathLike, **kwargs: Any) -> torch.nn.Module:
    """`ViTFTForImageClassification.from_pretrained`, naming the weight file when a local one cannot be read."""
    try:
        return ViTFTForImageClassification.from_pretrained(str(name), **kwargs)
    except (OSError, ValueError):
        raise
    except Exception as error:  # safetensors' and torch's errors on a truncated file name no file
        folder = Path(name)
        weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
        if not folder.is_dir() or not weights:
            raise
        raise OSError(
            f"{weights[0]} cannot be read ({type(error).__name__}: {' '.join(str(error).split())}): "
            "the file is truncated or corrupt. Copy or save the model again."
        ) from error


def _load_base_model(adapter: Path, config: Any) -> torch.nn.Module:
    """The adapter's recorded base model (a local folder or a Hub id), with the fine-tuned `config`. A base
    that is no folder here and cannot be loaded as a Hub id either is a FileNotFoundError naming it."""
    config_file = adapter / "adapter_config.json"
    base_name = json.loads(config_file.read_text())["base_model_name_or_path"]
    exists = bool(base_name) and Path(base_name).expanduser().exists()
    missing = FileNotFoundError(
        f"the LoRA adapter {adapter} needs its base model {base_name}"
        + ("" if os.path.isabs(base_name or "/") else " (relative to the folder the fine-tune ran in)")
        + ", which is no folder here"
        + ("" if looks_like_path(base_name or ".") else " nor a Hub model this machine can load")
        + f"; run from the fine-tune's folder, or set base_model_name_or_path in {config_file} to the base "
        "model's folder or Hub id."
    )
    if not exists and looks_like_path(base_name or "."):
        raise missing
    try:
        return _from_pretrained(base_name, config=config)
    except OSError as error:
        if exists:
            raise
        raise missing from error


def _check_finished(path: Path) -> None:
    """Refuse a local fine-tune folder whose run record says the run did not finish (its model may be missing,
    stale or half-written). Folders without a record (a transformers checkpoint, a Hub download) load as is."""
    if not path.is_dir():
        return
    try:
        record = read_run_record(path)
    except (OSError, ValueError):
        return
    if record is not None and record.get("finished", True) is False:
        folder = run_folder(path) or path
        raise ValueError(
            f"{folder} holds a fine-tune that did not finish ({RUN_RECORD_FILE} says finished: false); resume it "
            f"with scripts/finetune.py --recipe <its recipe> --output_dir {folder} --resume, or pass a finished "
            "model folder."
        )


def load_model(model: str | os.PathLike, merge_lora: bool = False) -> torch.nn.Module:
    """The classifier in `model` in eval mode: a vit_ft folder or Hub id, or a LoRA adapter (a folder with
    adapter_config.json, or an output folder whose adapter is in `adapter/`) on its recorded base model,
    merged when `merge_lora`. A missing local path is a FileNotFoundError that names it; an unreadable weight
    file an OSError that names the file."""
    check_model_path(model)
    path = Path(model).expanduser()
    _check_finished(path)
    adapter = path if is_adapter_folder(path) else None
    if adapter is None and not (path / "config.json").exists() and is_adapter_folder(path / ADAPTER_DIR):
        adapter = path / ADAPTER_DIR
    if adapter is None:
        return _from_pretrained(path if path.exists() else model).eval()
    from peft import PeftModel  # only adapters need peft

    from ..model.configuration_vit_ft import ViTFTConfig

    config = ViTFTConfig.from_pretrained(adapter)  # the fine-tuned architecture, labels and resolution
    base = _load_base_model(adapter, config)
    loaded = PeftModel.from_pretrained(base, adapter).eval()
    return loaded.merge_and_unload() if merge_lora else loaded


def _read_processor_config(model: str | os.PathLike) -> dict[str, Any] | None:
    """The image processor settings of a local folder (or its adapter/ subfolder), else of a Hub id, else the
    normalisation a timm checkpoint (`pretrained_cfg`) or a JAX `.npz` states, else None."""
    path = Path(model)
    for folder in (path, path / ADAPTER_DIR):
        candidate = folder / PROCESSOR_FILE
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    if not path.exists():
        try:
            from transformers import AutoImageProcessor

            return AutoImageProcessor.from_pretrained(str(model)).to_dict()
        except ImportError:  # a timm repo: transformers reads it as its timm_wrapper, which needs timm
            pass
        except (OSError, ValueError) as error:
            logger.warning("No image processor for %s (%s).", model, error)
            return None
    return checkpoint_normalization(model) or None


def read_preprocessing(
    model: str | os.PathLike,
    config: Any,
    image_size: int | Sequence[int] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_tokens: int | None = None,
) -> Preprocessing:
    """The model's evaluation preprocessing: mean/std/resample from its image processor, size from its config.

    `image_size` (an int or (height, width)) evaluates at another test-time resolution; it must be a multiple
    of the patch size (the model resamples its position embeddings to the new grid) and give at most
    `max_tokens` patch tokens (None: no bound).
    """
    size = tuple(config.image_hw) if image_size is None else _as_hw(image_size)
    patch = tuple(config.patch_hw)
    if size[0] % patch[0] or size[1] % patch[1] or min(size) <= 0:
        near = nearest_multiple(size, patch)
        raise ValueError(
            f"image_size={size[0]}x{size[1]} is not a multiple of the model's patch size {patch[0]}x{patch[1]}; "
            f"use e.g. --image_size {near[0]}"
            + ("" if near[0] == near[1] else f" (or {near[0]}x{near[1]})")
            + "."
        )
    tokens = (size[0] // patch[0]) * (size[1] // patch[1])
    if image_size is not None and max_tokens is not None and tokens > max_tokens:
        raise ValueError(
            f"--image_size {size[0]}x{size[1]} makes {tokens} patch tokens per image ({patch[0]}x{patch[1]} "
            f"patches), more than the bound of {max_tokens} (ViT-B/16 at 1024 px); pass a smaller --image_size, "
            f"or --max_tokens {tokens} to run it anyway (attention's cost grows with the square of the tokens)."
        )
    processor = _read_processor_config(model)
    if processor is None:
        logger.warning("No %s for %s: normalising with mean 0.5, std 0.5.", PROCESSOR_FILE, model)
        return Preprocessing(image_size=size, max_pixels=max_pixels)
    normalize, rescale = processor.get("do_normalize", True), processor.get("do_rescale", True)
    return Preprocessing(
        image_size=size,
        mean=tuple(float(v) for v in processor.get("image_mean", VIT_MEAN)) if normalize else (0.0,) * 3,
        std=tuple(float(v) for v in processor.get("image_std", VIT_STD)) if normalize else (1.0,) * 3,
        rescale_factor=float(processor.get("rescale_factor", RESCALE_FACTOR)) if rescale else 1.0,
        resample=int(processor.get("resample", Image.Resampling.BICUBIC)),
        max_pixels=max_pixels,
    )


def _as_hw(size: int | Sequence[int]) -> tuple[int, int]:
    if not isinstance(size, int) and len(size) == 1:
        size = size[0]
    try:
        return to_2tuple(size if isinstance(size, int) else tuple(int(v) for v in size), "image_size")
    except (TypeError, ValueError):
        raise ValueError(f"image_size={size!r} must be one int or a (height, width) pair.") from None


def load_classifier(
    model: str | os.PathLike,
    image_size: int | Sequence[int] | None = None,
    device: str | torch.device | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    merge_lora: bool = False,
    max_tokens: int | None = None,
    require_head: bool = True,
    bf16: str | bool = False,
) -> Classifier:
    """Load `model` (vit_ft folder, LoRA adapter folder or output folder with `adapter/`, or a Hub id) for
    inference, with its evaluation preprocessing, label names and run record.

    A LoRA model is kept unmerged (its adapters active) unless `merge_lora`; `image_size` changes only the input
    resolution: the model resamples its position embeddings on the fly, as `from_pretrained(image_size=...)`
    would; `max_tokens` bounds the patch tokens per image at that resolution (None: no bound).
    `require_head=False` accepts a backbone with no labels (a pre-trained ViTModel) for tools that only read
    its features (few-shot evaluation); its id2label is then empty. `bf16` ("auto", "true", "false" or a bool;
    see `use_bf16`) runs the model under bf16 autocast; the default keeps float32, the command-line tools'
    `--bf16 auto` turns it on where the hardware has native bf16.
    """
    device = torch.device(device) if device is not None else default_device()
    bf16 = use_bf16(bf16, device)  # a bad setting fails before the model loads
    loaded = load_model(model, merge_lora=merge_lora)
    if hasattr(loaded, "get_base_model"):  # a peft model: its base model holds the active LoRA layers
        loaded = loaded.get_base_model()
    config = loaded.config
    has_head = bool(getattr(config, "id2label", None)) and getattr(config, "num_labels", 0) >= 1
    if require_head and not has_head:
        raise ValueError(
            f"{model} has no classification head (no labels in its config); pass a fine-tuned model folder."
        )
    preprocessing = read_preprocessing(model, config, image_size, max_pixels, max_tokens)
    id2label = {int(k): str(v) for k, v in config.id2label.items()} if has_head else {}
    return Classifier(
        loaded.to(device).eval(), preprocessing, id2label, str(model), device, read_run_record(model), bf16
    )


# ---- the batched inference loop ---------------------------------------------------------------------------


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def progress_bar(total: int, desc: str, enabled: bool | None = None) -> tqdm:
    """A tqdm bar on stderr; `enabled=None` shows it only on a terminal."""
    return tqdm(total=total, desc=desc, unit="img", disable=None if enabled is None else not enabled)


def _try(function: Callable[[Any], Any], value: Any) -> Any:
    try:
        return function(value)
    except Exception as error:  # any failure makes this one image unusable, not the run
        return error


@dataclass
class Batch:
    """One batch of `iter_batches`: the sources, which of them decoded, and the model's outputs for those."""

    start: int  # index of sources[0] in the whole input
    sources: list[Any]
    decoded: list[int]  # offsets in `sources` of the images that decoded, in order
    errors: dict[int, BaseException]  # offset -> why that image did not decode
    outputs: Any = None  # forward(pixels of the decoded images); None when none decoded


def iter_batches(
    classifier: Classifier,
    sources: Sequence[Any],
    batch_size: int = 32,
    num_workers: int = 0,
    desc: str = "Predicting",
    progress: bool | None = None,
    forward: Callable[[torch.Tensor], Any] | None = None,
) -> Iterator[Batch]:
    """Decode `sources` (paths, bytes, {"bytes", "path"} values) with the classifier's transform and run
    `forward` (default: `classifier.logits`) on each batch of `(B, channels, height, width)` pixels.

    `num_workers` threads decode in parallel (Pillow releases the GIL while decoding), and decode the next batch
    while the model runs on this one (torch releases it too), so that decoding and compute overlap.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be positive.")
    forward = forward or classifier.logits
    pool = ThreadPoolExecutor(num_workers) if num_workers > 0 else None
    decode = classifier.transform.transform_image

    def submit(start: int) -> list[Future]:
        return [pool.submit(_try, decode, s) for s in sources[start : start + batch_size]]

    try:
        with progress_bar(len(sources), desc, progress) as bar:
            pending = None
            for start in range(0, len(sources), batch_size):
                chunk = list(sources[start : start + batch_size])
                if pool is None:
                    pixels = [_try(decode, s) for s in chunk]
                else:
                    futures = pending or submit(start)
                    # the workers decode the next batch while `forward` runs on this one (FIFO: this one first)
                    pending = submit(start + batch_size) if start + batch_size < len(sources) else None
                    pixels = [future.result() for future in futures]
                decoded = [i for i, p in enumerate(pixels) if isinstance(p, torch.Tensor)]
                errors = {i: p for i, p in enumerate(pixels) if not isinstance(p, torch.Tensor)}
                outputs = forward(torch.stack([pixels[i] for i in decoded])) if decoded else None
                bar.update(len(chunk))
                yield Batch(start, chunk, decoded, errors, outputs)
    finally:
        if pool is not None:
            pool.shutdown()


__all__ = [
    "BF16_CHOICES",
    "Batch",
    "Classifier",
    "Preprocessing",
    "check_model_path",
    "bf16_helps",
    "default_device",
    "describe_error",
    "iter_batches",
    "load_classifier",
    "load_model",
    "looks_like_path",
    "progress_bar",
    "read_preprocessing",
    "use_bf16",
]
