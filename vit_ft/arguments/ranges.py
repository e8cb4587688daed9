"""The range of every numeric field of the fine-tune's arguments, in one table (`RANGES`), walked by each
argument dataclass when it is built (`check_ranges`).

`RANGES` is the one statement of what each number may be (recipe key and flag alike): its interval, open or
closed, and whether it is an integer; NaN and infinity are outside every interval, so nothing non-finite reaches
a run or its record. The dataclasses walk it first thing in `__post_init__` (`FineTuneTrainingArguments` before
transformers' own checks), so that a bad number is one line naming the field, the value and the range, whether
the arguments come from a recipe, a flag or Python. `VALUE_RANGES` holds the numbers inside fields whose value is
more than a number (each class weight, a numeric decision threshold).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any

from .checks import RecipeError


@dataclass(frozen=True)
class Range:
    """An interval written as in mathematics, "[0, 1)" or "(0, inf)", and whether the value is an integer;
    `hint` says what the number is or how to choose it (the message's second half). None stays allowed where
    the field's type is optional (unset)."""

    interval: str
    hint: str
    integer: bool = False
    low: float = field(init=False)
    high: float = field(init=False)

    def __post_init__(self) -> None:
        low, high = (float(bound) for bound in self.interval[1:-1].split(","))
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def allows(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            return False
        if not math.isfinite(value):  # NaN compares false, inf would pass an open upper bound
            return False
        above = value > self.low if self.interval[0] == "(" else value >= self.low
        below = value < self.high if self.interval[-1] == ")" else value <= self.high
        return above and below

    def describe(self) -> str:
        """"positive", "a positive integer", "a finite number >= 0", "an integer >= 0" or "in [0, 1)"."""
        if self.high == math.inf:
            if self.integer:
                return "a positive integer" if self.low == 1 else f"an integer >= {self.low:g}"
            return "positive (a finite number > 0)" if self.interval[0] == "(" else f"a finite number >= {self.low:g}"
        return f"{'an integer ' if self.integer else ''}in {self.interval}"


# field -> its range, for every int / float field of ModelArguments, DataArguments (AugmentationArguments
# included) and FineTuneTrainingArguments (TrainingArguments' included): tests/arguments/test_ranges.py fails on
# a numeric field that is neither here nor in EXEMPT.
RANGES: dict[str, Range] = {
    # ModelArguments
    "image_size": Range("[1, inf)", "pixels, e.g. 224 or 384; unset to keep the checkpoint's resolution", True),
    "max_num_patches": Range("[1, inf)", "a patch budget per image, e.g. 256 (SigLIP 2 NaFlex)", True),
    "hidden_dropout_prob": Range("[0, 1)", "a probability, e.g. 0.1, or 0 to disable"),
    "attention_probs_dropout_prob": Range("[0, 1)", "a probability, e.g. 0.1, or 0 to disable"),
    "drop_path_rate": Range("[0, 1)", "e.g. 0.1 (DeiT/BEiT), 0 to disable, or unset for the checkpoint's own"),
    "lora_r": Range("[1, inf)", "the LoRA rank, e.g. 8 or 16", True),
    "lora_alpha": Range("[1, inf)", "the LoRA scale's numerator, e.g. equal to lora_r", True),
    "lora_dropout": Range("[0, 1)", "a probability, e.g. 0.1, or 0 to disable"),
    "vpt_tokens": Range("[1, inf)", "prompt tokens, e.g. 10 or 50, or unset for the default", True),
    "peft_r": Range("[1, inf)", "the adapter's rank or block size, e.g. 8, or unset for the method's default", True),
    "ladder_min_gain": Range("[0, 100]", "accuracy or mAP points, e.g. 1.0 (one percentage point); 0 climbs on any gain"),
    "budget_minutes": Range("(0, inf)", "minutes the ladder may spend, e.g. 30; leave it unset for no limit"),
    # DataArguments
    "validation_split_percentage": Range("[0, 1)", "a fraction: 0.1 holds out 10% of train, 0 nothing"),
    "max_train_samples": Range("[1, inf)", "a number of examples, or unset for all of them", True),
    "max_eval_samples": Range("[1, inf)", "a number of examples, or unset for all of them", True),
    "crop_scale_min": Range("(0, 1]", "the smallest crop's share of the area, 0.08 Inception-style, 1.0 for no zoom"),
    "max_bad_image_fraction": Range("[0, 1]", "a fraction of the training images, e.g. 0.01; 1 never fails"),
    # PassArguments (the passes after training)
    "bank_max_images": Range("[0, inf)", "a number of training images, e.g. 20000, or none (0) for no bank", True),
    # AugmentationArguments (the RandAugment bounds are vit_ft.data.augmentation's MAX_NUM_OPS, MAX_MAGNITUDE)
    "rand_augment_num_ops": Range("[1, 15]", "timm's n, ops per image; 2 is usual", True),
    "rand_augment_magnitude": Range("[0, 10]", "timm's m; 9 is usual", True),
    "color_jitter": Range("[0, 1]", "timm's --color-jitter, e.g. 0.4; 0 is off"),
    "random_erasing_prob": Range("[0, 1]", "a probability, e.g. 0.25 (DeiT); 0 is off"),
    "mixup_alpha": Range("[0, inf)", "the Beta distribution's alpha, e.g. 0.8 (DeiT); 0 turns mixup off"),
    "cutmix_alpha": Range("[0, inf)", "the Beta distribution's alpha, e.g. 1.0 (DeiT); 0 turns cutmix off"),
    "mixup_prob": Range("[0, 1]", "the probability that a batch is mixed, e.g. 1.0"),
    "mixup_switch_prob": Range("[0, 1]", "the probability of cutmix instead of mixup, e.g. 0.5"),
    # TrainingArguments: the schedule and the optimizer
    "learning_rate": Range("(0, inf)", "e.g. 0.001 for AdamW, 0.01 for SGD"),
    "num_train_epochs": Range("[0, inf)", "e.g. 10; 0 only with max_steps > 0"),
    "max_steps": Range("[-1, inf)", "a number of optimizer steps, or -1 to train num_train_epochs", True),
    "warmup_steps": Range("[0, inf)", "a number of steps, or a fraction of the run's below 1 (e.g. 0.1)"),
    "weight_decay": Range("[0, inf)", "e.g. 0.05, or 0 for none"),
    "adam_beta1": Range("[0, 1)", "e.g. 0.9"),
    "adam_beta2": Range("[0, 1)", "e.g. 0.999"),
    "adam_epsilon": Range("[0, inf)", "e.g. 1e-8"),
    "max_grad_norm": Range("[0, inf)", "e.g. 1.0, or 0 for no clipping"),
    "label_smoothing_factor": Range("[0, 1)", "e.g. 0.1, or 0 for none"),
    "neftune_noise_alpha": Range("(0, inf)", "NEFTune's noise scale, e.g. 5, or unset for none"),
    "gradient_accumulation_steps": Range("[1, inf)", "batches per optimizer step, e.g. 4", True),
    "global_batch_size": Range("[1, inf)", "images per optimizer step over all processes, e.g. 512, or unset", True),
    "per_device_train_batch_size": Range("[1, inf)", "images per device and step, e.g. 32", True),
    "per_device_eval_batch_size": Range("[1, inf)", "images per device and step, e.g. 64", True),
    "seed": Range("[0, 4294967295]", "numpy's seed range, e.g. 42", True),
    "data_seed": Range("[0, 4294967295]", "numpy's seed range, or unset to use seed", True),
    # TrainingArguments: logging, evaluation and checkpoints (a step count, or below 1 a fraction of the run)
    "logging_steps": Range("(0, inf)", "steps between logs, e.g. 50, or a fraction of the run below 1"),
    "eval_steps": Range("(0, inf)", "steps between evaluations, or a fraction below 1; unset for logging_steps"),
    "save_steps": Range("(0, inf)", "steps between checkpoints, e.g. 500, or a fraction of the run below 1"),
    "eval_delay": Range("[0, inf)", "epochs or steps before the first evaluation, e.g. 0"),
    "eval_accumulation_steps": Range("[1, inf)", "evaluation steps per transfer to the CPU, or unset", True),
    "save_total_limit": Range("[1, inf)", "checkpoints kept, e.g. 2, or unset to keep all", True),
    "torch_empty_cache_steps": Range("[1, inf)", "steps between torch.cuda.empty_cache(), or unset", True),
    # TrainingArguments: data loading and the launch
    "dataloader_num_workers": Range(
        "[0, inf)", "worker processes, e.g. 4, auto (one a core, less one) or 0 to load in the main one", True
    ),
    "dataloader_prefetch_factor": Range("[1, inf)", "batches each worker loads ahead, e.g. 2, or unset", True),
    "ddp_bucket_cap_mb": Range("[1, inf)", "DDP's gradient bucket size in MB, e.g. 25, or unset", True),
    "ddp_timeout": Range("[1, inf)", "seconds, e.g. 1800", True),
    "local_rank": Range("[-1, inf)", "set by the launcher; -1 outside a distributed launch", True),
    # FineTuneTrainingArguments
    "layer_decay": Range("(0, 1]", "0.65-0.75 for ViT-B, 1 for no decay, or unset"),
    "ema_decay": Range("(0, 1)", "e.g. 0.999, or unset to keep no EMA"),
    "early_stopping_patience": Range("[1, inf)", "evaluations without improvement, e.g. 3, or unset", True),
    "early_stopping_threshold": Range("[0, inf)", "the least improvement that counts, e.g. 0"),
    "distillation_alpha": Range("[0, 1]", "the teacher's share of the loss, e.g. 0.5 (DeiT)"),
    "distillation_tau": Range("(0, inf)", "the soft distillation's temperature, e.g. 1.0 (DeiT)"),
}
# numeric fields with no range, each with the reason (none today: every number a recipe can set has one)
EXEMPT: dict[str, str] = {}
# the numbers inside fields whose value is more than a number, checked where the value is parsed
# (training_arguments.parse_class_weights, parse_decision_threshold): each class weight, a numeric threshold
VALUE_RANGES: dict[str, Range] = {
    "class_weights": Range("(0, inf)", "1 is the usual weight; leave a class out to give it 1"),
    "decision_threshold": Range("(0, 1)", "a probability, e.g. 0.5"),
}


def range_error(name: str, value: Any) -> RecipeError:
    """The one-line error for `name=value` outside its range: the value, the range and what to choose."""
    bounds = RANGES[name]
    return RecipeError(f"{name}={value!r} must be {bounds.describe()}: {bounds.hint}.")


def check_ranges(arguments: Any) -> None:
    """Raise `range_error` for the first field of the dataclass `arguments` outside its range in RANGES (None is
    left to the field's type: an optional field may be unset). Cheap: no data, no model."""
    for item in fields(arguments):
        value = getattr(arguments, item.name)
        if item.name in RANGES and value is not None and not RANGES[item.name].allows(value):
            raise range_error(item.name, value)


__all__ = ["EXEMPT", "RANGES", "VALUE_RANGES", "Range", "check_ranges", "range_error"]
