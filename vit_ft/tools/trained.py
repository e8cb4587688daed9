"""The one reader of a trained model: `load_trained(ref)` reads a vit_ft output folder, a LoRA adapter folder
(or an output folder with `adapter/`), a transformers / timm / JAX checkpoint folder or a Hub id once, and
returns everything the tools need from it in one `Trained` object: the model (eval mode, on its device), its
evaluation preprocessing, label names, the fine-tune's run record and where it all came from (`Origin`).
predict, evaluate, inspect, few-shot, push and the demo take that object and never read the folder again;
peft is imported only for an adapter.

    trained = load_trained("outputs/digits")
    trained.origin.run_folder, trained.run_record["recipe"], trained.preprocessing.image_size
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..data.images import DEFAULT_MAX_PIXELS
from ..data.input_spec import InputSpec, input_spec
from ..data.transforms import ImageClassificationTransform
from ..kernels import kernelize
from ..model.adapters import merge_adapter
from ..model.checkpoint_checks import check_complete, check_sizes, weight_shapes, weights_file_name
from ..model.checks import check_image_size
from ..model.conversion import HEAD_KEYS
from ..model.formats import checkpoint_normalization
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..model.timm_format import read_safetensors_shapes
from ..tasks import Task, task_for
from ..utils.hardware import inference_device
from ..utils.hub_ids import TRAINED_MODEL, check_reference, looks_like_path
from ..utils.run_record import (
    ADAPTER_DIR,
    CALIBRATION_KEY,
    EXAMPLES_DIR,
    PROCESSOR_FILE,
    RUN_RECORD_FILE,
    is_adapter_folder,
    read_run_record,
    run_folder,
)
from .inference import check_finite_pixels, use_bf16

logger = logging.getLogger("vit_ft")


# ---- where a model comes from ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a trained model comes from, and what its folder says besides the weights (read once, by `locate`).

    `path` is the local folder (None for a Hub id); `run_folder` the fine-tune's output folder (the parent of
    an `adapter/` folder); `adapter` its LoRA adapter folder, if any (the folder itself, or its `adapter/`);
    `record` the fine-tune's run record (`vit_ft_run.json`), None for a Hub id or a folder that is no fine-tune
    output. The image processor settings are read on first use (`processor`), once.
    """

    name: str  # as the user gave it
    path: Path | None = None
    run_folder: Path | None = None
    adapter: Path | None = None
    record: dict[str, Any] | None = None

    @property
    def hub_id(self) -> str | None:
        return self.name if self.path is None else None

    @property
    def examples_dir(self) -> Path | None:
        """The fine-tune's example images (`examples/`), when the folder has them."""
        folder = self.run_folder / EXAMPLES_DIR if self.run_folder is not None else None
        return folder if folder is not None and folder.is_dir() else None

    @property
    def loads_adapter(self) -> bool:
        """Whether the model loads as base model + adapter: the folder is the adapter, or holds no model of its
        own beside `adapter/` (a LoRA run's merged model at the root is loaded as is)."""
        return self.adapter is not None and (
            self.adapter == self.path or not (self.path / "config.json").exists()
        )

    @cached_property
    def processor(self) -> dict[str, Any] | None:
        """The image processor settings: the folder's (or its adapter's) preprocessor_config.json, a Hub model's
        image processor, else the normalisation a timm checkpoint (`pretrained_cfg`) or a JAX `.npz` states;
        None when there are none."""
        if self.path is not None:
            for folder in (self.path, self.path / ADAPTER_DIR):
                if (folder / PROCESSOR_FILE).is_file():
                    return json.loads((folder / PROCESSOR_FILE).read_text(encoding="utf-8"))
            return checkpoint_normalization(self.path) or None
        try:
            from transformers import AutoImageProcessor

            # never the repository's code, and never a prompt to run it in the middle of a run
            return AutoImageProcessor.from_pretrained(self.name, trust_remote_code=False).to_dict()
        except ImportError:  # a timm repo: transformers reads it as its timm_wrapper, which needs timm
            return checkpoint_normalization(self.name) or None
        except (OSError, ValueError) as error:
            logger.warning("No image processor for %s (%s).", self.name, error)
            return None

    @cached_property
    def hub_calibration(self) -> dict[str, Any] | None:
        """A Hub model's calibration as its pushed run record states it (`--format vit_ft` carries the record; the
        transformers format folds the temperature into the head instead), `{CALIBRATION_KEY: ...}`, or None. Only
        the calibration: the record's data paths are another machine's."""
        if self.path is not None:
            return None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            record = json.loads(Path(hf_hub_download(self.name, RUN_RECORD_FILE)).read_text(encoding="utf-8"))
        except (OSError, ValueError, EntryNotFoundError):  # no record pushed (or none cached offline): none
            return None
        found = record.get(CALIBRATION_KEY) if isinstance(record, dict) else None
        return None if found is None else {CALIBRATION_KEY: found}


def locate(model: str | os.PathLike) -> Origin:
    """Where `model` is and what its folder records, read once. A missing local path is a FileNotFoundError
    naming it; a fine-tune whose run record says it did not finish is a ValueError naming the fix."""
    check_reference(model, f"--model {model}", TRAINED_MODEL, folder=True)
    path = Path(model).expanduser()
    if not path.exists():
        return Origin(str(model))
    record = read_run_record(path)
    folder = run_folder(path) or path
    if record is not None and record.get("finished", True) is False:
        raise ValueError(
            f"{folder} holds a fine-tune that did not finish ({RUN_RECORD_FILE} says finished: false); resume it "
            f"with scripts/finetune.py --recipe <its recipe> --output_dir {folder} --resume, or pass a finished "
            "model folder."
        )
    adapter = path if is_adapter_folder(path) else None
    if adapter is None and is_adapter_folder(path / ADAPTER_DIR):
        adapter = path / ADAPTER_DIR
    return Origin(str(model), path, folder, adapter, record)


# ---- the model -------------------------------------------------------------------------------------------------


def _from_pretrained(name: str | os.PathLike, new_head: bool = False, **kwargs: Any) -> torch.nn.Module:
    """`ViTFTForImageClassification.from_pretrained` of a trained model, whole or not at all: a tensor missing,
    left over or of another shape is a ValueError naming the weight file and the tensor (`check_complete`); a
    local weight file that cannot be read is an OSError naming it. `new_head`: the head may be new (a LoRA
    adapter's base model, whose head the adapter brings)."""
    try:
        # lenient here (strict=False, ignore_mismatched_sizes): `check_complete` below names every kind of fault
        model, info = ViTFTForImageClassification.from_pretrained(
            str(name), output_loading_info=True, ignore_mismatched_sizes=True, strict=False, **kwargs
        )
    except (OSError, ValueError):
        raise
    except Exception as error:  # safetensors' and torch's errors on a truncated file name no file
        weights = weights_file_name(name)
        if not Path(weights).is_file():
            raise
        raise OSError(
            f"{weights} cannot be read ({type(error).__name__}: {' '.join(str(error).split())}): "
            "the file is truncated or corrupt. Copy or save the model again."
        ) from error
    # a new head: the linear layer's keys, or every key of a zero-shot head (`head_type: zeroshot`)
    heads = (*HEAD_KEYS, *(key for key in model.state_dict() if key.startswith("classifier."))) if new_head else ()
    check_complete(info, weights_file_name(name), allowed=heads)
    return model


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
        found = weight_shapes(base_name)  # the adapter's sizes against the base's weights, before building
        weights_name, shapes = found if found is not None else (None, None)
        config_dict = json.loads((adapter / "config.json").read_text(encoding="utf-8"))
        skip = ("num_labels", "positions")  # the fine-tune's own labels and resolution
        check_sizes(config_dict, shapes, str(adapter / "config.json"), weights_name, skip=skip)
        return _from_pretrained(base_name, new_head=True, config=config)
    except OSError as error:
        if exists:
            raise
        raise missing from error


def load_model(model: str | os.PathLike | Origin, merge_lora: bool = False) -> torch.nn.Module:
    """The classifier `model` (a path or Hub id, or the `Origin` that `locate` made of one) in eval mode, with
    the CPU kernels swapped in (`kernels.kernelize`): a vit_ft folder or Hub id, or a LoRA adapter on its
    recorded base model, merged when `merge_lora`. The model loads whole or not at all: a config whose sizes
    disagree with its weights (checked before any layer is built), a tensor missing, left over or of another shape
    is a ValueError naming the file and the field or tensor; an unreadable weight file is an OSError naming it."""
    origin = model if isinstance(model, Origin) else locate(model)
    if not origin.loads_adapter:
        return kernelize(_from_pretrained(origin.path or origin.name)).eval()
    from peft import PeftModel  # only adapters need peft

    from ..model.configuration_vit_ft import ViTFTConfig

    config = ViTFTConfig.from_pretrained(origin.adapter)  # the fine-tuned architecture, labels and resolution
    base = kernelize(_load_base_model(origin.adapter, config))  # before peft wraps its layers
    weights = origin.adapter / "adapter_model.safetensors"
    try:
        loaded = PeftModel.from_pretrained(base, origin.adapter).eval()
    except RuntimeError as error:  # torch's size mismatch, naming no file
        raise ValueError(
            f"{weights} does not fit its base model ({' '.join(str(error).split())[:300]}); a trained model loads "
            "whole or not at all. Copy or save the adapter again."
        ) from error
    _check_adapter_complete(loaded, weights)
    return merge_adapter(loaded) if merge_lora else loaded


def _check_adapter_complete(loaded: Any, weights: Path) -> None:
    """Every LoRA tensor (and saved module, the head) the adapter's model needs is in `weights`, and nothing
    else is: peft itself initialises a missing one and only warns."""
    from peft import get_peft_model_state_dict

    expected = set(get_peft_model_state_dict(loaded))
    saved = set(read_safetensors_shapes(weights)) if weights.is_file() else set()
    info = {"missing_keys": expected - saved, "unexpected_keys": saved - expected, "mismatched_keys": []}
    check_complete(info, str(weights))


# ---- the loaded model -------------------------------------------------------------------------------------------


@dataclass
class Trained:
    """A loaded trained model: the model (in eval mode, on `device`), its preprocessing, label names, and where
    it came from (`origin`: folder, adapter, Hub id, and the fine-tune's run record)."""

    model: torch.nn.Module
    preprocessing: InputSpec
    id2label: dict[int, str]
    origin: Origin
    device: torch.device
    bf16: bool = False  # run the model under bf16 autocast (see `inference.use_bf16`)
    transform: ImageClassificationTransform = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.transform = self.preprocessing.eval_transform()

    @property
    def source(self) -> str:
        return self.origin.name

    @property
    def run_record(self) -> dict[str, Any] | None:
        return self.origin.record

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def task(self) -> Task:
        """The model's task (`vit_ft.tasks`, from its config's `problem_type`) with what the model holds of it: a
        single-label model's calibration temperature (fitted on the fine-tune's validation split, in its run
        record, or a Hub model's pushed one), a multi-label model's decision threshold (tuned there, in its config)."""
        return task_for(self.model.config, self.run_record or self.origin.hub_calibration)

    @property
    def temperature(self) -> float:
        """The calibration temperature the task divides the logits by (1.0: none, and for a multi-label model)."""
        return self.task.temperature

    def autocast(self) -> torch.autocast:
        """bf16 autocast on the model's device when `bf16`, else a no-op context."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.inference_mode()
    def logits(self, pixel_values: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """`(batch, channels, height, width)` normalised pixels, or a NaFlex batch (`transform.collate`'s dict) ->
        float32 logits `(batch, num_labels)` on CPU. Pixels that are not finite (NaN, inf) are a ValueError: they
        would give NaN logits, read as a label."""
        inputs = pixel_values if isinstance(pixel_values, dict) else {"pixel_values": pixel_values}
        check_finite_pixels(inputs["pixel_values"])
        with self.autocast():
            out = self.model(**{name: value.to(self.device) for name, value in inputs.items()})
        return out.logits.float().cpu()

    def probabilities(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The task's probabilities `(batch, num_labels)`, float32: the calibrated softmax of `logits /
        temperature`, or the sigmoid of each logit (independent per label)."""
        return torch.from_numpy(self.task.probabilities(self.logits(pixel_values))).float()


def load_trained(
    model: str | os.PathLike | Origin,
    image_size: int | Sequence[int] | None = None,
    device: str | torch.device | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    merge_lora: bool = False,
    max_tokens: int | None = None,
    require_head: bool = True,
    bf16: str | bool = False,
) -> Trained:
    """Load `model` (vit_ft folder, LoRA adapter folder or output folder with `adapter/`, checkpoint folder,
    Hub id, or an `Origin` that `locate` returned) for inference, reading its folder once.

    A LoRA model is kept unmerged (its adapters active) unless `merge_lora`; `image_size` changes only the input
    resolution: the model resamples its position embeddings on the fly, as `from_pretrained(image_size=...)`
    would; `max_tokens` bounds the patch tokens per image at that resolution (None: no bound).
    `require_head=False` accepts a backbone with no labels (a pre-trained ViTModel) for tools that only read
    its features (few-shot evaluation); its id2label is then empty. `bf16` ("auto", "true", "false" or a bool;
    see `inference.use_bf16`) runs the model under bf16 autocast; the default keeps float32, the command-line
    tools' `--bf16 auto` turns it on where the hardware has native bf16.
    """
    device = inference_device(device)
    bf16 = use_bf16(bf16, device)  # a bad setting fails before the model loads
    origin = model if isinstance(model, Origin) else locate(model)
    loaded = load_model(origin, merge_lora=merge_lora)
    if hasattr(loaded, "get_base_model"):  # a peft model: its base model holds the active LoRA layers
        loaded = loaded.get_base_model()
    config = loaded.config
    has_head = bool(getattr(config, "id2label", None)) and getattr(config, "num_labels", 0) >= 1
    if require_head and not has_head:
        raise ValueError(
            f"{origin.name} has no classification head (no labels in its config); pass a fine-tuned model folder."
        )
    size = check_image_size(image_size, config.patch_hw, max_tokens, default=tuple(config.image_hw))
    preprocessing = input_spec(origin.processor, config, size, max_pixels, origin.name)
    id2label = {int(k): str(v) for k, v in config.id2label.items()} if has_head else {}
    return Trained(loaded.to(device).eval(), preprocessing, id2label, origin, device, bf16)


__all__ = [
    "Origin",
    "Trained",
    "check_image_size",
    "load_model",
    "load_trained",
    "locate",
]
