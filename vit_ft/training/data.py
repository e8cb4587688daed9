"""The data stage: the train / validation (/ test) splits loaded as the recipe names them (image folders, a Hub
or saved dataset, or streamed: `data.datasets.load_image_datasets`, one loader), an audit's exclusions applied,
the bad images of the small splits dropped, split across the processes, and the class names."""

from __future__ import annotations

import logging
from typing import Any

import datasets
from transformers import TrainingArguments

from ..arguments.data_loading import data_seed
from ..arguments.fields import DataArguments
from ..data.bad_images import prescan_small_splits
from ..data.datasets import RECIPE_FIELDS, load_image_datasets
from ..data.exclusions import apply_exclusions, read_exclusions
from ..data.training_split import in_words, max_steps_for, place

logger = logging.getLogger("vit_ft")

# what a stream cannot give before training: every label of the split (max_train_samples: `stream_splits`)
_STREAM_REFUSED = {
    "class_weights": "a class's weight needs its count over the whole training split",
    "balanced_sampler": "it draws by index from the whole split",
    "pos_weight": "it is counted over the whole training split",
    "exclude": "a stream is not read whole before training, so the images it names cannot be found",
}


def load_data(data_args: DataArguments, training_args: TrainingArguments) -> tuple[dict[str, Any], list[str]]:
    """The train / validation (/ test) splits, the bad images of the small ones dropped (`check_images`; larger
    splits' are skipped where decoded), and the class names; with `streaming`, train is a `TrainStream` (never
    scanned before training: its bad images are skipped where decoded) split across the processes, with the
    schedule in steps (max_steps, or derived from the size the metadata states); evaluation splits read once."""
    if data_args.streaming:
        _refuse_with_streaming(data_args, training_args)
    desc = "reading the evaluation splits of the stream" if data_args.streaming else "loading the images"
    with training_args.main_process_first(desc=desc):
        splits, names = load_image_datasets(
            **{name: getattr(data_args, name) for name in RECIPE_FIELDS},
            seed=data_seed(training_args),
            cache_dir=getattr(data_args, "cache_dir", None),
            label_names=data_args.class_names,
        )
    if data_args.exclude:  # an audit's findings: dropped or relabelled, recorded in the run record's "data"
        splits = _excluded(splits, names, data_args)
    if data_args.check_images and not data_args.streaming:  # outside the barrier: each process scans its own
        splits = datasets.DatasetDict(prescan_small_splits(splits, "image", logger))
    _check_two_classes(names, data_args)
    _place(splits["train"], training_args)
    logger.info("Data: %s; %d classes.", in_words(splits), len(names))
    return splits, names


def _excluded(splits: dict[str, Any], names: list[str], data_args: DataArguments) -> datasets.DatasetDict:
    plan = read_exclusions(data_args.exclude)
    subsampled = data_args.max_train_samples is not None or data_args.max_eval_samples is not None
    applied, data_args.exclude_applied = apply_exclusions(dict(splits), names, plan, subsampled)
    logger.info("exclude: %s: %d training images dropped, %d relabelled.", plan.file,
                data_args.exclude_applied["dropped"], data_args.exclude_applied["relabelled"])  # fmt: skip
    return datasets.DatasetDict(applied)


def _place(train: Any, training_args: TrainingArguments) -> None:
    """The training split across the processes, and the max_steps a stream trains for when none is set."""
    batch = training_args.per_device_train_batch_size
    place(train, training_args.process_index, training_args.world_size, batch)
    if training_args.max_steps > 0:
        return
    global_batch = batch * training_args.gradient_accumulation_steps * training_args.world_size
    steps = max_steps_for(train, training_args.num_train_epochs, global_batch)
    if steps is not None:
        training_args.max_steps = steps
        logger.info("Streaming: max_steps=%d (%s epochs of the stated size).", steps, training_args.num_train_epochs)


def _refuse_with_streaming(data_args: DataArguments, training_args: TrainingArguments) -> None:
    """One line for an option a stream cannot serve (`_STREAM_REFUSED`), before anything is read."""
    for key, why in _STREAM_REFUSED.items():
        value = getattr(data_args, key, None) if hasattr(data_args, key) else getattr(training_args, key, None)
        if value not in (None, False):
            raise ValueError(f"{key}={value!r} does not go with streaming: {why}; or drop streaming.")


def _check_two_classes(names: list[str], data_args: DataArguments) -> None:
    if len(names) < 2:
        source = data_args.train_dir or f"dataset {data_args.dataset_name!r}"
        raise ValueError(
            f"the training data in {source} has {len(names)} class ({names}); a classifier needs at least two. "
            "Add images of the other classes."
        )


__all__ = ["load_data"]
