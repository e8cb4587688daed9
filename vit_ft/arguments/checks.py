"""The checks of the built arguments, run once by `vit_ft.arguments.recipes.parse_args` (`validate`): everything
across the dataclasses and against the launch that needs no network, no model and no data.

A model path that does not exist, a schedule that trains nothing, a launch Trainer does not join, a push while
offline, the evaluation setup and the toolkit's keys (early stopping, EMA, class imbalance). What one dataclass's
own fields can tell is checked by its `__post_init__` when it is built (`recipes.parse_args`),
including the image size against the checkpoint and mixed precision against the hardware, so that a bad
combination fails before anything is downloaded or loaded.
"""

import os
from typing import Any

from transformers import TrainingArguments

from vit_ft.arguments.fields import DataArguments, ModelArguments, RecipeError, suggest
from vit_ft.metrics import METRIC_NAMES
from vit_ft.metrics.multilabel import MULTILABEL_METRIC_NAMES
from vit_ft.model.checks import check_model_path as check_path


def check_model_path(model_args: ModelArguments) -> None:
    """Fail early when model_name_or_path is a path (not a Hub id) that does not exist and nothing will build it
    (`pretrain_if_missing`), instead of transformers' "Repo id must be in the form ..." later."""
    if model_args.pretrain_if_missing is None:
        name = model_args.model_name_or_path
        expected = "a checkpoint folder or a Hub id (e.g. google/vit-base-patch16-224-in21k)"
        check_path(name, f"model_name_or_path={name!r}", expected, RecipeError)


def check_schedule(training_args: Any) -> None:
    """Fail early on a run that cannot train: no epochs or steps, or a learning rate that is not positive."""
    max_steps = getattr(training_args, "max_steps", -1)
    if max_steps == 0 or (max_steps < 0 and training_args.num_train_epochs <= 0):
        raise RecipeError(
            f"num_train_epochs={training_args.num_train_epochs} and max_steps={max_steps} train nothing "
            "(the model would be saved untrained); set --num_train_epochs to 1 or more, or --max_steps > 0."
        )
    if not training_args.learning_rate > 0:
        raise RecipeError(
            f"learning_rate={training_args.learning_rate} must be positive (e.g. 0.001 for AdamW, 0.01 for SGD); "
            "set --learning_rate."
        )


def check_world_size(training_args: TrainingArguments, environ: dict[str, str] | None = None) -> None:
    """Fail when a launcher started several processes that Trainer does not join into one job.

    `accelerate launch --multi_gpu --num_processes 2` without a GPU and without `--use_cpu true` sets
    WORLD_SIZE=2 but Trainer sees one process each: two independent runs would write the same output folder.
    """
    environ = os.environ if environ is None else environ
    try:
        launched = int(environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return
    if launched > 1 and training_args.world_size == 1:
        raise RecipeError(
            f"{launched} processes were launched (WORLD_SIZE={launched}) but Trainer sees each as a separate "
            "one-process job, so they would all write the same output folder. On CPU add --use_cpu true, or "
            "launch with --config_file recipes/accelerate_configs/cpu_2proc.yaml; otherwise launch one process."
        )


def check_push(training_args: Any) -> None:
    """Fail early when --push_to_hub is set but the Hub is switched off (HF_HUB_OFFLINE)."""
    if not getattr(training_args, "push_to_hub", False):
        return
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise RecipeError(
            "--push_to_hub is set but the Hub is offline (HF_HUB_OFFLINE=1), so the push would fail after "
            "training; drop --push_to_hub and push the finished folder later with vit-ft push (scripts/push_to_hub.py)."
        )


def check_evaluation(data_args: DataArguments, training_args: TrainingArguments) -> None:
    """Fail early when evaluation is on but has no data, or best-model selection watches a metric we never compute."""
    metric = training_args.metric_for_best_model
    if metric is not None:
        name = metric.removeprefix("eval_")
        # ema_<metric>: the same metrics of the weights' moving average (ema_decay), see check_ema
        names = (*METRIC_NAMES, *MULTILABEL_METRIC_NAMES, "loss")  # multi-label: mAP, f1_micro, ...
        known = (*names, *(f"ema_{n}" for n in names))
        if name not in known:
            allowed = ", ".join(names)
            raise RecipeError(
                f"metric_for_best_model={metric!r} is not computed here; use one of {allowed} (ema_<metric> for "
                f"the EMA's, with ema_decay set){suggest(name, known) or '.'}"
            )
    if not _evaluates(training_args):
        return
    if data_args.validation_split_percentage > 0:
        return
    if data_args.train_dir and not data_args.validation_dir:
        raise RecipeError(
            "Evaluation is on but there is no validation data: set validation_dir, or validation_split_percentage "
            "> 0 to hold out part of train_dir, or --eval_strategy no."
        )
    if data_args.dataset_name and not data_args.validation_split:
        raise RecipeError(
            "Evaluation is on but there is no validation data: set validation_split to the dataset's validation "
            "split, or validation_split_percentage > 0 to hold out part of train, or --eval_strategy no."
        )


def _evaluates(training_args: Any) -> bool:
    return str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy)) != "no"


def check_early_stopping(training_args: Any) -> None:
    """Early stopping needs a validation metric to watch and the best checkpoint to fall back on.

    Refused rather than switched on for the user: without load_best_model_at_end the run would end on weights
    `early_stopping_patience` evaluations past the best (transformers only warns).
    """
    if training_args.early_stopping_patience is None:
        if training_args.early_stopping_threshold:
            raise RecipeError(
                "early_stopping_threshold is set but early_stopping_patience is not; set --early_stopping_patience "
                "(e.g. 3 evaluations) or drop the threshold."
            )
        return
    patience = f"early_stopping_patience={training_args.early_stopping_patience}"
    if not _evaluates(training_args) or training_args.metric_for_best_model is None:
        raise RecipeError(
            f"{patience} has no validation metric to watch: set --eval_strategy epoch (or steps) and "
            "--metric_for_best_model (e.g. accuracy), or drop early_stopping_patience."
        )
    if not training_args.load_best_model_at_end:
        raise RecipeError(
            f"{patience} needs --load_best_model_at_end true, so that the stopped run keeps its best checkpoint "
            "rather than the weights of the last, worse evaluations."
        )


def check_ema(training_args: Any) -> None:
    """The EMA keys agree: EMA metrics need an EMA, and the best checkpoint is picked by the model that is saved."""
    metric = (training_args.metric_for_best_model or "").removeprefix("eval_")
    watches_ema = metric.startswith("ema_")
    if training_args.ema_decay is None:
        if training_args.ema_as_final_model or training_args.ema_warmup or watches_ema:
            what = (
                "ema_as_final_model"
                if training_args.ema_as_final_model
                else ("ema_warmup" if training_args.ema_warmup else f"metric_for_best_model={metric}")
            )
            raise RecipeError(f"{what} needs an EMA of the weights: set --ema_decay (e.g. 0.999).")
        return
    if not training_args.load_best_model_at_end or not training_args.metric_for_best_model:
        return
    if training_args.ema_as_final_model and not watches_ema:
        raise RecipeError(
            f"ema_as_final_model saves the EMA, but the best checkpoint is picked by the trained weights' {metric}; "
            f"set --metric_for_best_model ema_{metric} (or --load_best_model_at_end false)."
        )
    if watches_ema and not training_args.ema_as_final_model:
        raise RecipeError(
            f"metric_for_best_model={metric} picks the best checkpoint by the EMA, but the trained weights are "
            "saved; set --ema_as_final_model true, or watch the trained weights' metric (e.g. accuracy)."
        )


def check_imbalance(training_args: Any) -> None:
    """Class weights and the balanced sampler each correct the imbalance; both together correct it twice."""
    if training_args.class_weights is not None and training_args.balanced_sampler:
        raise RecipeError(
            "class_weights and balanced_sampler both correct for imbalanced classes (together they over-correct); "
            "keep one of them."
        )


def validate(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments) -> None:
    """Every check across the arguments, once, cheapest first-to-fail order: model path, schedule, launch, push,
    evaluation setup, then the toolkit's keys (early stopping, EMA, class imbalance).

    Needs no network. Data folders are not required to exist yet: `vit_ft.data.datasets.load_image_datasets`
    checks them, naming the argument, when it loads them.
    """
    check_model_path(model_args)
    check_schedule(training_args)
    check_world_size(training_args)
    check_push(training_args)
    check_evaluation(data_args, training_args)
    if hasattr(training_args, "ema_decay"):  # a FineTuneTrainingArguments, as parse_args makes
        check_early_stopping(training_args)
        check_ema(training_args)
        check_imbalance(training_args)


__all__ = [
    "check_early_stopping",
    "check_ema",
    "check_evaluation",
    "check_imbalance",
    "check_model_path",
    "check_push",
    "check_schedule",
    "check_world_size",
    "validate",
]
