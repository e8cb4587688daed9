"""`FineTuneTrainingArguments`: transformers' `TrainingArguments` plus the fine-tuning toolkit's training keys.

Layer-wise learning-rate decay and the weight-decay exemptions (`vit_ft.training.optimizer`), an exponential
moving average of the weights (`vit_ft.training.ema`), early stopping (transformers' `EarlyStoppingCallback`)
and imbalanced classes (`vit_ft.training.imbalance`). A subclass, as TRL's `SFTConfig` extends TrainingArguments,
so that these are recipe keys and flags like `learning_rate`; each is off by default. `__post_init__` checks each
value alone; the checks across fields (patience needs a metric to watch, ...) are in `argument_checks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from ..tasks.losses import BALANCED
from ..tasks.threshold import TUNE, TUNE_PER_CLASS


def data_seed(args: TrainingArguments) -> int:
    """The seed of everything about the data (hold-out, sampler, mixup): `data_seed`, else `seed`, as Trainer's
    own sampler takes it."""
    return args.data_seed if args.data_seed is not None else args.seed


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
        if not weights[str(label)] > 0:
            raise ValueError(
                f"class_weights[{label!r}]={weight!r} must be positive (1 is the usual weight; leave a class out "
                "to give it 1)."
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
    if not 0.0 < number < 1.0:  # NaN fails too
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

    layer_decay: float | None = field(
        default=None,
        metadata={
            "help": "Layer-wise learning-rate decay (BEiT, timm's --layer-decay): the head and final norm train "
            "at learning_rate, block i of L at learning_rate * layer_decay^(L - i), the embeddings at "
            "layer_decay^(L + 1). In (0, 1]; BEiT/MAE fine-tune ViT-B with 0.65-0.75. None: off."
        },
    )
    weight_decay_tokens: bool = field(
        default=False,
        metadata={
            "help": "Also apply weight_decay to the class token and position embeddings (the names the model's "
            "no_weight_decay() lists). Off: they are exempt, as in timm and BEiT; biases and norms are always "
            "exempt. true restores Trainer's plain grouping (for comparisons)."
        },
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "help": "Keep an exponential moving average of the weights, updated after each optimizer step with "
            "this decay (timm's --model-ema-decay, e.g. 0.9998 for long runs, 0.99-0.999 for a few hundred "
            "steps); it is evaluated at each evaluation (eval_ema_* metrics) and kept in checkpoints. None: off."
        },
    )
    ema_warmup: bool = field(
        default=False,
        metadata={
            "help": "Warm the EMA decay up as timm's ModelEmaV3(use_warmup=True): 1 - (1 + step)^(-2/3), capped "
            "at ema_decay, so that the average forgets the first steps' weights quickly."
        },
    )
    ema_as_final_model: bool = field(
        default=False,
        metadata={
            "help": "Save the EMA weights as the final model (and report their metrics as eval_*/test_*). With "
            "load_best_model_at_end, set metric_for_best_model to an EMA metric (e.g. ema_accuracy): the best "
            "checkpoint's EMA is then the one saved."
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop when metric_for_best_model has not improved for this many evaluations (transformers' "
            "EarlyStoppingCallback); needs evaluation and load_best_model_at_end. None: off."
        },
    )
    early_stopping_threshold: float = field(
        default=0.0,
        metadata={"help": "How much metric_for_best_model must improve to count as an improvement."},
    )
    class_weights: dict | str | None = field(
        default=None,
        metadata={
            "help": "Weigh the loss per class: 'balanced' (n_samples / (n_classes * count), scikit-learn's "
            "compute_class_weight) or a mapping label -> weight (YAML: {cat: 2.0}; flag: cat=2.0,dog=1; labels "
            "left out weigh 1). None: off."
        },
    )
    balanced_sampler: bool = field(
        default=False,
        metadata={
            "help": "Draw training images with replacement, each class equally often (a seeded function of "
            "(seed, epoch), so --resume replays it); epochs keep their length."
        },
    )

    pos_weight: str | None = field(
        default=None,
        metadata={
            "help": "Multi-label only: BCE positive weight per label, 'balanced' (negatives / positives of the "
            "label in train, as torch's BCEWithLogitsLoss pos_weight), or unset for none."
        },
    )
    decision_threshold: str = field(
        default=TUNE,
        metadata={
            "help": "Multi-label only: the probability at or above which a label is predicted. 'tune': one "
            "threshold for all labels with the best micro F1 on the validation split after training; "
            "'tune_per_class': one per label (its best F1); or a number in (0, 1), e.g. 0.5. Saved in the "
            "model's config (decision_threshold) and used by every tool; the test split never chooses it."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self.decision_threshold = parse_decision_threshold(self.decision_threshold)
        if self.pos_weight is not None and self.pos_weight != BALANCED:
            raise ValueError(
                f"pos_weight={self.pos_weight!r} is not supported; use 'balanced', or leave it unset."
            )
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(
                f"layer_decay={self.layer_decay!r} must be in (0, 1] (0.65-0.75 for ViT-B, 1 for no decay), or unset."
            )
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(
                f"ema_decay={self.ema_decay!r} must be in (0, 1) (e.g. 0.999), or unset to keep no EMA."
            )
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError(
                f"early_stopping_patience={self.early_stopping_patience} must be at least 1 evaluation, or unset."
            )
        if self.early_stopping_threshold < 0:
            raise ValueError(f"early_stopping_threshold={self.early_stopping_threshold!r} must be >= 0.")
        self.class_weights = parse_class_weights(self.class_weights)


__all__ = [
    "BALANCED",
    "TUNE",
    "TUNE_PER_CLASS",
    "FineTuneTrainingArguments",
    "parse_class_weights",
    "parse_decision_threshold",
]
