"""What the model sees of each image: the train and evaluation transforms on the splits, the batches' mixup /
cutmix, and `augmentations.png`, a few training images as the model sees them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainingArguments, ViTImageProcessorPil

from ..arguments.data_loading import data_seed
from ..arguments.fields import DataArguments
from ..data.bad_images import decode_error
from ..data.input_spec import InputSpec, input_spec
from ..data.training_split import first_images, set_transforms
from ..data.transforms import ImageClassificationTransform

AUGMENTATIONS_FIGURE = "augmentations.png"


def attach_transforms(
    splits: dict[str, Any], processor: ViTImageProcessorPil, data_args: DataArguments, seed: int, config: Any = None
) -> ImageClassificationTransform:
    """Random-resized-crop + flip (+ the recipe's RandAugment, colour jitter, random erasing) for training,
    resize + center crop for evaluation (`model_input_spec`, the spec the tools read back), normalised by the
    processor.

    The train split gains `INDEX_COLUMN` (its row positions) and its augmentation becomes a function of (seed,
    epoch, index); returns the train transform, whose epoch `AugmentationEpochCallback` sets. It returns uint8
    crops: the rest runs per batch on the training device (`build_trainer`'s `BatchAugmentation`). With the model's
    `config` asking for NaFlex (`max_num_patches`), NaFlex patches instead, everything in the workers.
    """
    spec = model_input_spec(processor, config)
    spec.check_batch_mixes(data_args.mixes_batches)  # a checkpoint's own patch budget (a flag's: with the plan)
    train_transform = spec.train_transform(
        crop_scale=(data_args.crop_scale_min, 1.0), horizontal_flip=data_args.horizontal_flip, seed=seed,
        augmentation=data_args.augmentation_spec(),  # None: no per-image augmentation asked for
    )  # fmt: skip
    set_transforms(splits, train_transform, spec.eval_transform())
    return train_transform


def model_input_spec(processor: ViTImageProcessorPil, config: Any = None) -> InputSpec:
    """The fine-tuned model's InputSpec: its processor's size and normalisation, the NaFlex patch budget of its
    `config` where it has one; what the saved folder's tools read back (`tools.trained`)."""
    return input_spec(processor, config, (processor.size["height"], processor.size["width"]))


def build_mixup(data_args: DataArguments, training_args: TrainingArguments, num_classes: int) -> Any | None:
    """The training batches' mixup / cutmix collator (soft targets, label smoothing folded in), or None when off."""
    if not data_args.mixes_batches:
        return None
    from ..data.mixup import MixupCutmix

    return MixupCutmix(
        num_classes=num_classes,
        mixup_alpha=data_args.mixup_alpha,
        cutmix_alpha=data_args.cutmix_alpha,
        prob=data_args.mixup_prob,
        switch_prob=data_args.mixup_switch_prob,
        label_smoothing=training_args.label_smoothing_factor,
        seed=data_seed(training_args),
    )


def write_augmentations(
    splits: dict[str, Any],
    transform: ImageClassificationTransform,
    mixup: Any | None,
    training_args: TrainingArguments,
) -> None:
    """`augmentations.png` in the output folder (process 0): a few training images, each in several augmented
    draws as the model sees them (and one mixed batch of them with mixup / cutmix)."""
    if training_args.process_index != 0:
        return
    from ..reports.augmentation_figure import write_augmentation_figure

    # four that decode: large and streamed splits are not scanned before training (data.bad_images)
    images = [image for image in first_images(splits["train"], 16) if not decode_error(image)][:4]
    if not images:
        return
    path = Path(training_args.output_dir) / AUGMENTATIONS_FIGURE
    write_augmentation_figure(images, transform, path, mixer=mixup, seed=training_args.seed)


__all__ = ["AUGMENTATIONS_FIGURE", "attach_transforms", "build_mixup", "write_augmentations"]
