"""How the tools run a loaded model: the device and bf16 setting, and the one batched inference loop.

`iter_batches` runs a model (a `vit_ft.tools.trained.Trained`, or anything with its `transform` and `logits`)
over many images a batch at a time, turning an image that does not decode into an error for that image instead
of a crash.

    trained = load_trained("outputs/digits")
    for batch in iter_batches(trained, ["a.png", "b.png"]):
        batch.outputs  # (decoded images, num_labels) logits
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..data.transforms import ImageClassificationTransform
from ..tasks import Task, task_for
from ..utils.hardware import bf16_helps, compute_for
from ..utils.progress import Progress

logger = logging.getLogger("vit_ft")


BF16_CHOICES = ("auto", "true", "false")


def use_bf16(setting: str | bool, device: torch.device) -> bool:
    """Whether to run under bf16 autocast: "auto" where `utils.hardware.bf16_helps` (measured faster),
    "true" / "false" (or a bool) as said. Logs the choice and its kernels in one line (`hardware.compute_for`):
    a warning where bf16 runs emulated, on a CPU without native bf16 products."""
    if isinstance(setting, bool):
        bf16 = setting
    elif setting in BF16_CHOICES:
        bf16 = bf16_helps(device) if setting == "auto" else setting == "true"
    else:
        raise ValueError(f"--bf16 {setting} must be one of {', '.join(BF16_CHOICES)}.")
    compute_for(device, "bf16" if bf16 else "float32").log()
    return bf16


# ---- the batched inference loop ---------------------------------------------------------------------------


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def source_name(source: Any) -> str:
    """How an error names an input of the loop: its path (a {"bytes", "path"} value's too), else its kind."""
    path = source.get("path") if isinstance(source, dict) else source
    if isinstance(path, (str, os.PathLike)) and str(path):
        return str(path)
    return f"an image given as {type(source).__name__}"


def check_finite_pixels(pixel_values: torch.Tensor, what: str = "pixel_values") -> torch.Tensor:
    """`pixel_values`, or a ValueError naming `what` when any is NaN or infinite: the model would give NaN
    logits, read as a label. The tools check here, on the way in (a CPU pass over the input), never in the model's
    forward, where it would cost a pass and a host sync every step and break compiled graphs."""
    if not torch.isfinite(pixel_values).all():
        raise ValueError(
            f"{what}: the pixels hold NaN or infinite values; pass images, or float pixels normalised as the "
            "model's transform does (finite values)."
        )
    return pixel_values


def _try(function: Callable[[Any], Any], value: Any) -> Any:
    try:
        return function(value)
    except Exception as error:  # any failure makes this one image unusable, not the run
        return error


class Runnable(Protocol):
    """What the loop needs of a loaded model: its eval transform and its logits (`trained.Trained` has both),
    and optionally its `task` (`vit_ft.tasks`; single-label without calibration when it has none)."""

    transform: ImageClassificationTransform

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Batch:
    """One batch of `iter_batches`: the sources, which of them decoded, and the model's outputs for those."""

    start: int  # index of sources[0] in the whole input
    sources: list[Any]
    decoded: list[int]  # offsets in `sources` of the images that decoded, in order
    errors: dict[int, BaseException]  # offset -> why that image did not decode
    outputs: Any = None  # forward(pixels of the decoded images); None when none decoded
    task: Task = field(default_factory=task_for)  # the model's (`trained.Trained.task`): its probabilities

    @property
    def probabilities(self) -> torch.Tensor | None:
        """The task's probabilities `(decoded images, num_labels)` from logit outputs (calibrated softmax, or a
        sigmoid per label); None when no image decoded."""
        return None if self.outputs is None else torch.from_numpy(self.task.probabilities(self.outputs))


def iter_batches(
    classifier: Runnable,
    sources: Sequence[Any],
    batch_size: int = 32,
    num_workers: int = 0,
    desc: str = "Predicting",
    progress: bool | None = None,
    forward: Callable[[torch.Tensor], Any] | None = None,
) -> Iterator[Batch]:
    """Decode `sources` (paths, bytes, {"bytes", "path"} values) with the classifier's transform and run
    `forward` (default: `classifier.logits`) on each batch of `(B, channels, height, width)` pixels. An image
    that does not decode, or whose pixels are not finite (`check_finite_pixels`), is an error for that image.

    `num_workers` threads decode in parallel (Pillow releases the GIL while decoding), and decode the next batch
    while the model runs on this one (torch releases it too), so that decoding and compute overlap.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be positive.")
    forward = forward or classifier.logits
    task = getattr(classifier, "task", None) or task_for()
    pool = ThreadPoolExecutor(num_workers) if num_workers > 0 else None
    transform_image = classifier.transform.transform_image
    collate = getattr(classifier.transform, "collate", torch.stack)  # a NaFlex transform pads and masks

    def decode(source: Any) -> torch.Tensor:  # an image whose pixels are not finite is an error for that image
        return check_finite_pixels(transform_image(source), source_name(source))

    def submit(start: int) -> list[Future]:
        return [pool.submit(_try, decode, s) for s in sources[start : start + batch_size]]

    try:
        with Progress(len(sources), desc, enabled=progress) as bar:  # a bar, or plain lines in a log
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
                # stacked pixels, or a padded NaFlex batch (the transform's own collation)
                outputs = forward(collate([pixels[i] for i in decoded])) if decoded else None
                bar.update(len(chunk))
                yield Batch(start, chunk, decoded, errors, outputs, task)
    finally:
        if pool is not None:
            pool.shutdown()


__all__ = [
    "BF16_CHOICES",
    "Batch",
    "check_finite_pixels",
    "describe_error",
    "iter_batches",
    "Runnable",
    "source_name",
    "use_bf16",
]
