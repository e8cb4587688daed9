"""`vit-ft audit --oof finetune`: out-of-fold probabilities from k-fold fine-tunes, a candidate beside the probes.

Each fold is the fine-tune itself (`vit-ft finetune`'s run plan and stages, handed in by the command as a
`FineTuner`: `tools` do not import `training`) on the other folds' images with the labels the audit was given
(the self-check's flipped ones when it runs again), for `steps` optimizer steps, LoRA or full (`OOF_METHODS`),
with the checkpoint family's fine-tuning protocol (`arguments.family_defaults`: the fine-tune's family defaults)
and any fine-tune flags the user adds (`flags`, last: they win; with `--recipe` the recipe's protocol replaces the
family's). It trains in a temporary folder, one process, the folds in turn; the held-out fold is never in its
training or validation images: a tenth of the training folds (each class's first of every ten, seeded) is its
validation split, which the fine-tune fits its calibration temperature on, so the probabilities confident
learning reads are calibrated. The fold's model then predicts its held-out images (`trained.load_trained`, the
tools' batched loop). The candidate (`finetune/<method>`) joins the probes' table and is chosen by the same rule
(lowest out-of-fold log-loss); chosen, the self-check fine-tunes the folds again on its flipped labels.

Only on request: k fine-tunes cost minutes where the probes cost seconds, and the case where they help most (a
backbone pre-trained on the faulted labels, which learned some flips: issue 46) is one the probes' own figures
cannot see, so no automatic trigger would catch it; the warning of a weak audit names `--oof finetune`.

    tuner = FineTuner(build_plan, run_finetune)   # what vit_ft.commands.audit hands in
    probabilities = fold_finetune_probabilities(OofFinetune(tuner, "full", 200), model, images, labels, names, 5, 0)
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...arguments.family_defaults import FAMILY_DEFAULTS, checkpoint_family
from ..inference import iter_batches
from ..trained import load_trained
from .findings import stratified_folds
from .probes import PROBABILITY_FLOOR

logger = logging.getLogger("vit_ft")

OOF_PICKS = ("loss", "finetune")  # how the source is chosen: lowest out-of-fold log-loss, or the fine-tunes
OOF_METHODS = ("full", "lora")  # the fine-tune's two methods of the issue (`--method full | lora`)
OOF_STEPS = 200  # per fold: on digits' 1,150 training images about 5 epochs of batch 32
FOLD_BATCH = 32  # per device; a flag in --oof_flags (per_device_train_batch_size) changes it
VALIDATION_PARTS = 10  # one part in ten of the training folds is the fold's validation split (its temperature)


@dataclass(frozen=True)
class FineTuner:
    """The fine-tune as the audit runs it: `plan` (its flags -> a checked run plan: `arguments.recipes.build_plan`)
    and `run` (a plan -> the fine-tune into the plan's output folder: `training.stages.run_finetune`)."""

    plan: Callable[[list[str]], Any]
    run: Callable[[Any], Any]


@dataclass(frozen=True)
class OofFinetune:
    """`--oof finetune`'s settings: the `tuner`, the `method` (OOF_METHODS), the `steps` each fold trains for,
    the user's extra fine-tune `flags`, and `pick` (OOF_PICKS): "loss", the candidate chosen as the probes are
    (lowest out-of-fold log-loss), or "finetune", the fine-tunes' probabilities whatever their log-loss (for a
    backbone that may have seen these labels: its probes' log-loss is lowest where it learned the flips)."""

    tuner: FineTuner
    method: str = "full"
    steps: int = OOF_STEPS
    flags: tuple[str, ...] = ()
    pick: str = "loss"

    def __post_init__(self) -> None:
        if self.pick not in OOF_PICKS:
            raise ValueError(f"--oof_pick {self.pick} is not one of {', '.join(OOF_PICKS)}; e.g. --oof_pick finetune.")
        if self.method not in OOF_METHODS:
            raise ValueError(f"--oof_method {self.method} is not one of {', '.join(OOF_METHODS)}; e.g. --oof_method lora.")
        if self.steps < 1:
            raise ValueError(f"--oof_steps {self.steps} must be at least 1 (the optimizer steps each fold's fine-tune "
                             f"trains for), e.g. --oof_steps {OOF_STEPS}.")  # fmt: skip

    @property
    def name(self) -> str:
        """The candidate's name in the probes' table."""
        return f"finetune/{self.method}"


def family_flags(model: str) -> list[str]:
    """The fine-tune flags of the checkpoint family's protocol (`FAMILY_DEFAULTS`; none for an unknown family)."""
    family = checkpoint_family(str(model))
    if family is None:
        return []
    values = FAMILY_DEFAULTS[family].values
    return [part for key, value in values.items() if value is not None
            for part in (f"--{key}", str(value).lower() if isinstance(value, bool) else str(value))]  # fmt: skip


def fold_flags(oof: OofFinetune, model: str, data: Path, output: Path, seed: int, image_size: Any = None) -> list[str]:
    """The fine-tune's command line of one fold: `data` (a save_to_disk folder of the fold's splits) into
    `output`, `oof.steps` steps of `oof.method`, no checkpoints, evaluation or feature bank on the way (the
    final evaluation and the temperature on the fold's validation split stay), the family's protocol unless the
    user's flags name a recipe, and the user's flags last."""
    steps = oof.steps
    flags = ["--model_name_or_path", str(model), "--dataset_name", str(data), "--output_dir", str(output),
             "--method", oof.method, "--max_steps", str(steps), "--seed", str(seed),
             "--per_device_train_batch_size", str(FOLD_BATCH), "--validation_split_percentage", "0",
             "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false",
             "--report_to", "none", "--logging_steps", str(max(1, steps // 10)), "--bank_max_images", "0",
             "--dataloader_num_workers", "0", "--disable_tqdm", "true"]  # fmt: skip
    if image_size is not None:
        size = image_size if isinstance(image_size, int) else image_size[0]
        flags += ["--image_size", str(size)]
    if "--recipe" not in oof.flags:
        flags += family_flags(model)
    return flags + list(oof.flags)


def check_fold_flags(oof: OofFinetune, model: str, options: Any) -> None:
    """A fold's fine-tune command line checked as the fine-tune checks its own (the user's `--oof_flags`
    included), before the audit loads anything: a bad flag is one line now, not after the features' pass."""
    with tempfile.TemporaryDirectory(prefix="vit-ft-audit-") as work:
        oof.tuner.plan(fold_flags(oof, model, Path(work) / "data", Path(work) / "fold", options.seed, options.image_size))


def write_fold(images: Sequence[Any], labels: np.ndarray, names: list[str], train: np.ndarray, seed: int,
               folder: Path) -> Path:  # fmt: skip
    """The fold's data as a save_to_disk DatasetDict in `folder`: "train" (the `train` rows, less its
    validation part) and "validation" (one in VALIDATION_PARTS of each class's training rows, seeded; a class
    with one training image keeps it in train), images as the audit read them, labels as given."""
    import datasets

    part = stratified_folds(labels[train], VALIDATION_PARTS, seed)
    counts = np.bincount(labels[train], minlength=len(names))
    held = (part == 0) & (counts[labels[train]] >= 2)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})

    def split(rows: np.ndarray) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"image": [images[i] for i in rows], "label": labels[rows].tolist()},
                                          features=features)  # fmt: skip

    splits = {"train": split(train[~held])}
    if held.any():
        splits["validation"] = split(train[held])
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def held_out_probabilities(model: Path, images: Sequence[Any], options: Any) -> np.ndarray:
    """`(len(images), num_classes)` calibrated probabilities of the fold's fine-tuned `model` on its held-out
    `images` (they all decoded in the audit's own pass)."""
    trained = load_trained(model, options.image_size, options.device, max_tokens=options.max_tokens, bf16=options.bf16)
    rows = [batch.probabilities.numpy() for batch in iter_batches(trained, images, options.batch_size,
                                                                   progress=False)]  # fmt: skip
    return np.concatenate(rows)


def fold_finetune_probabilities(
    oof: OofFinetune, model: str, images: Sequence[Any], labels: np.ndarray, names: list[str], folds: int,
    options: Any, what: str = "out-of-fold",
) -> np.ndarray:  # fmt: skip
    """`(n, num_classes)` out-of-fold probabilities: fold k's images predicted by a fine-tune of `model` on the
    other folds (`fold_flags`), in a temporary folder removed after; `options` the audit's (`AuditOptions`:
    seed, image size, device, batch size). The fold's data (a save_to_disk copy: the images' bytes) and model are
    removed before the next fold's are written."""
    labels = np.asarray(labels, np.int64)
    fold = stratified_folds(labels, folds, options.seed)
    probabilities = np.zeros((len(labels), len(names)))
    with tempfile.TemporaryDirectory(prefix="vit-ft-audit-") as work:
        for k in range(folds):  # one fold's data on disk at a time: it holds the images' bytes
            data, output = Path(work) / "data", Path(work) / "fold"
            held = np.flatnonzero(fold == k)
            write_fold(images, labels, names, np.flatnonzero(fold != k), options.seed, data)
            plan = oof.tuner.plan(fold_flags(oof, model, data, output, options.seed, options.image_size))
            logger.info("%s fine-tune fold %d/%d: %s, %d steps on %d images, then its %d held out predicted.", what,
                        k + 1, folds, oof.method, oof.steps, len(labels) - len(held), len(held))  # fmt: skip
            with _quiet_fine_tune():
                oof.tuner.run(plan)
                probabilities[held] = held_out_probabilities(output, [images[i] for i in held], options)
            for folder in (data, output):
                shutil.rmtree(folder, ignore_errors=True)
    probabilities = np.clip(probabilities, PROBABILITY_FLOOR, None)  # as the probes': no label impossible
    return probabilities / probabilities.sum(axis=1, keepdims=True)


class _quiet_fine_tune:  # noqa: N801 - a context manager used like a function
    """The fold's fine-tune logs at warning level (its step lines stay): its run summary names a temporary
    folder and commands that do not apply."""

    def __enter__(self) -> None:
        self.level = logger.level
        logger.setLevel(max(logging.WARNING, self.level))

    def __exit__(self, *exc: Any) -> None:
        logger.setLevel(self.level)


__all__ = ["FOLD_BATCH", "OOF_METHODS", "OOF_PICKS", "OOF_STEPS", "FineTuner", "OofFinetune", "check_fold_flags", "family_flags",
           "fold_finetune_probabilities", "fold_flags", "write_fold"]  # fmt: skip
