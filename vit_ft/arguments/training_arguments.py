"""`FineTuneTrainingArguments`: transformers' `TrainingArguments` plus the fine-tuning toolkit's training keys.

Layer-wise learning-rate decay and the weight-decay exemptions (`vit_ft.training.optimizer`), an exponential
moving average of the weights (`vit_ft.training.ema`), early stopping (transformers' `EarlyStoppingCallback`),
imbalanced classes (`vit_ft.training.imbalance`), the multi-label decision threshold, distillation and the global
batch. A subclass, as TRL's `SFTConfig` extends TrainingArguments, so that these are recipe keys and flags like
`learning_rate`; each is off by default. `__post_init__` checks every number against its range
(`ranges.RANGES`, transformers' fields too) and mixed precision against the hardware (`precision.check_precision`)
before transformers' own, vaguer, checks and device errors, then each other value alone (`parse_class_weights`,
`parse_decision_threshold`); the checks across fields (patience needs a metric to watch, ...) are in `checks`.
The values they are built from are `merge.merge_values`'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from ..utils.option_values import BALANCED, TUNE, TUNE_PER_CLASS
from .checks import RecipeError
from .help import option
from .precision import check_precision
from .ranges import VALUE_RANGES, check_ranges


def parse_class_weights(value: Any) -> str | dict[str, float] | None:
    """`balanced`, a mapping {label: weight} (YAML), or its command-line forms `'{"cat": 2}'` / `cat=2,dog=0.5`.

    Labels become strings (class folder names; YAML reads `0: 2.0` as the int 0); weights must be positive.
    """
    if value is None or isinstance(value, dict):
        mapping = value
    elif str(value).strip() == BALANCED:
        return BALANCED
    else:
        text = str(value).strip()
        try:
            mapping = json.loads(text) if text.startswith("{") else dict(_pairs(text))
        except ValueError:
            mapping = None
        if not isinstance(mapping, dict) or not mapping:
            raise ValueError(
                f"class_weights={value!r} is neither 'balanced' nor a label->weight mapping; write "
                "class_weights: balanced, or e.g. --class_weights cat=2,dog=1 (YAML: class_weights: {cat: 2, dog: 1})."
            )
    if mapping is None:
        return None
    weights = {}
    for label, weight in mapping.items():
        try:
            weights[str(label)] = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"class_weights[{label!r}]={weight!r} is not a number.") from None
        if not VALUE_RANGES["class_weights"].allows(weights[str(label)]):  # NaN or inf would make the loss NaN
            raise ValueError(
                f"class_weights[{label!r}]={weight!r} must be a positive finite number (1 is the usual weight; "
                "leave a class out to give it 1)."
            )
    return weights


def parse_decision_threshold(value: Any) -> str | float:
    """`decision_threshold` as TUNE, TUNE_PER_CLASS or a float in (0, 1); anything else a one-line ValueError."""
    text = str(value).strip()
    if text in (TUNE, TUNE_PER_CLASS):
        return text
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not VALUE_RANGES["decision_threshold"].allows(number):  # NaN fails too
        raise ValueError(
            f"decision_threshold={value!r} must be '{TUNE}', '{TUNE_PER_CLASS}' or a probability strictly between "
            "0 and 1, e.g. 0.5."
        )
    return number


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    if any(not sep for _, sep, _ in pairs):
        raise ValueError(text)
    return [(label.strip(), weight.strip()) for label, _, weight in pairs]


@dataclass
class FineTuneTrainingArguments(TrainingArguments):
    """TrainingArguments with layer decay, EMA, early stopping and class-imbalance keys (all off by default)."""

    layer_decay: float | None = option(
        None,
        "Layer-wise learning-rate decay (BEiT, timm's --layer-decay): the head and final norm train "
        "at learning_rate, block i of L at learning_rate * layer_decay^(L - i), the embeddings at "
        "layer_decay^(L + 1). In (0, 1]; BEiT/MAE fine-tune ViT-B with 0.65-0.75. None: off.",
    )
    weight_decay_tokens: bool = option(
        False,
        "Also apply weight_decay to the class token and position embeddings (the names the model's "
        "no_weight_decay() lists). Off: they are exempt, as in timm and BEiT; biases and norms are always "
        "exempt. true restores Trainer's plain grouping (for comparisons).",
    )
    ema_decay: float | None = option(
        None,
        "Keep an exponential moving average of the weights, updated after each optimizer step with "
        "this decay (timm's --model-ema-decay, e.g. 0.9998 for long runs, 0.99-0.999 for a few hundred "
        "steps); it is evaluated at each evaluation (eval_ema_* metrics) and kept in checkpoints. None: off.",
    )
    ema_warmup: bool = option(
        False,
        "Warm the EMA decay up as timm's ModelEmaV3(use_warmup=True): 1 - (1 + step)^(-2/3), capped "
        "at ema_decay, so that the average forgets the first steps' weights quickly.",
    )
    ema_as_final_model: bool = option(
        False,
        "Save the EMA weights as the final model (and report their metrics as eval_*/test_*). With "
        "load_best_model_at_end, set metric_for_best_model to an EMA metric (e.g. ema_accuracy): the best "
        "checkpoint's EMA is then the one saved.",
    )
    early_stopping_patience: int | None = option(
        None,
        "Stop when metric_for_best_model has not improved for this many evaluations (transformers' "
        "EarlyStoppingCallback); needs evaluation and load_best_model_at_end. None: off.",
    )
    early_stopping_threshold: float = option(
        0.0, "How much metric_for_best_model must improve to count as an improvement."
    )
    class_weights: dict | str | None = option(
        None,
        "Weigh the loss per class: 'balanced' (n_samples / (n_classes * count), scikit-learn's "
        "compute_class_weight) or a mapping label -> weight (YAML: {cat: 2.0}; flag: cat=2.0,dog=1; labels "
        "left out weigh 1). None: off.",
    )
    balanced_sampler: bool = option(
        False,
        "Draw training images with replacement, each class equally often (a seeded function of "
        "(seed, epoch), so --resume replays it); epochs keep their length.",
    )

    pos_weight: str | None = option(
        None,
        "Multi-label only: BCE positive weight per label, 'balanced' (negatives / positives of the "
        "label in train, as torch's BCEWithLogitsLoss pos_weight), or unset for none.",
    )
    decision_threshold: str = option(
        TUNE,
        "Multi-label only: the probability at or above which a label is predicted. 'tune': one "
        "threshold for all labels with the best micro F1 on the validation split after training; "
        "'tune_per_class': one per label (its best F1); or a number in (0, 1), e.g. 0.5. Saved in the "
        "model's config (decision_threshold) and used by every tool; the test split never chooses it.",
    )

    teacher_model_name_or_path: str | None = option(
        None,
        "Distil from this fine-tuned classifier (DeiT): a vit_ft output folder (e.g. outputs/digits), a "
        "transformers image classifier or a Hub id of one, with the data's classes. It runs in eval mode on "
        "each augmented training batch; a student with a distillation token learns it with that head, "
        "one without on its logits. None: off.",
    )
    distillation_type: str | None = option(
        None,
        "DeiT's distillation: 'hard' (cross-entropy with the teacher's top class; DeiT's best) or "
        "'soft' (KL divergence at distillation_tau). Unset: hard, with a teacher.",
    )
    distillation_alpha: float | None = option(
        None, "The teacher's share of the loss, in [0, 1]: (1 - alpha) labels + alpha teacher. Unset: 0.5."
    )
    distillation_tau: float | None = option(
        None, "The soft distillation's temperature, > 0. Unset: 1.0 (DeiT's)."
    )

    global_batch_size: int | None = option(
        None,
        "Images per optimizer step over all processes (the recipe's contract: the ViT paper's 512). "
        "gradient_accumulation_steps is derived: global_batch_size / (per_device_train_batch_size x processes); "
        "refused when it does not divide, or beside a gradient_accumulation_steps that disagrees. None: "
        "per_device_train_batch_size x processes x gradient_accumulation_steps (grows with the processes).",
    )

    def __post_init__(self):
        check_ranges(self)  # before TrainingArguments' own checks, which an inf or a NaN can pass or crash
        check_precision(self)  # before TrainingArguments' own device errors, which say less
        super().__post_init__()
        self.decision_threshold = parse_decision_threshold(self.decision_threshold)
        if self.pos_weight is not None and self.pos_weight != BALANCED:
            raise ValueError(
                f"pos_weight={self.pos_weight!r} is not supported; use 'balanced', or leave it unset."
            )
        self.class_weights = parse_class_weights(self.class_weights)
        if self.distillation_type is not None and self.distillation_type not in ("soft", "hard"):
            raise RecipeError(
                f"distillation_type={self.distillation_type!r} is not one of: soft, hard (DeiT's); hard is its best."
            )


__all__ = [
    "BALANCED",
    "TUNE",
    "TUNE_PER_CLASS",
    "FineTuneTrainingArguments",
    "TrainingArguments",
    "parse_class_weights",
    "parse_decision_threshold",
]
