"""The checks of the fine-tune's arguments across the built dataclasses and against the checkpoint and the launch,
run once by `vit_ft.arguments.recipes.build_plan` (`validate`) before any work; and `RecipeError`, the one error
of a recipe or command line that cannot become valid arguments.

Each number's range is room 3's table (`ranges.RANGES`), walked by each dataclass when it is built. `validate`
then checks a pooling the checkpoint cannot do, a schedule that trains nothing, a launch Trainer does not join, a
global batch the launch does not make, a push while offline, the evaluation setup and the toolkit's keys (early
stopping, EMA, class imbalance, distillation). What one dataclass can tell of its other fields (choices, names) is
checked by its `__post_init__`, including the image size against the checkpoint and mixed precision against the
hardware (`precision.check_precision`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vit_ft.metrics import METRIC_NAMES
from vit_ft.metrics.multilabel import MULTILABEL_METRIC_NAMES

from ..data.naflex import refuse_batch_mixes

if TYPE_CHECKING:
    from transformers import TrainingArguments


class RecipeError(ValueError):
    """A recipe or command line that cannot become valid arguments; the message says what to change."""


def suggest(name: str, candidates: Iterable[str]) -> str:
    """'; did you mean <closest candidate>?' for an error message, or '' when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---- the checks across the built arguments -------------------------------------------------------------------


def check_schedule(training_args: Any) -> None:
    """Fail early on a run that cannot train: neither epochs nor steps (each one's range is in RANGES)."""
    max_steps = getattr(training_args, "max_steps", -1)
    if max_steps == 0 or (max_steps < 0 and training_args.num_train_epochs <= 0):
        raise RecipeError(
            f"num_train_epochs={training_args.num_train_epochs} and max_steps={max_steps} train nothing "
            "(the model would be saved untrained); set --num_train_epochs to 1 or more, or --max_steps > 0."
        )


# the poolings that read the class token (the model's config refuses them without one)
CLASS_TOKEN_POOLINGS = ("cls", "cls+mean")


def check_pooling(model_args: Any) -> None:
    """Refuse a pooling that reads the class token for a checkpoint without one (SigLIP's), before any data loads.

    As timm refuses `global_pool='token'` with `class_token=False`: the run would otherwise pool the first patch
    token and save a folder no tool loads. The checkpoint's config is read where it is on this machine (a folder,
    the HF cache); a Hub checkpoint not downloaded yet is refused by the model's config when it is built.
    """
    pooling = model_args.pooling
    if pooling not in CLASS_TOKEN_POOLINGS:
        return
    from vit_ft.model.checks import read_local_config  # the model package: only for a pooling it must check

    config = read_local_config(model_args.model_name_or_path, model_args.cache_dir) or {}
    if config.get("class_token", True):
        return
    own = config.get("pooling", "map")
    others = ", ".join(choice for choice in ("map", "mean") if choice != own)
    raise RecipeError(
        f"pooling={pooling!r}: {model_args.model_name_or_path} has no class token (a SigLIP-style ViT); use "
        f"pooling: {own} (the checkpoint's own), or {others}; or leave pooling unset for its own."
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


def check_global_batch(training_args: Any) -> None:
    """Fail when the batch Trainer will take differs from the stated `global_batch_size` (arguments built in Python
    without `merge_values`, or a world size other than the launch's): its accumulation derives from the world size
    (`global_batch.resolve_global_batch`)."""
    total = getattr(training_args, "global_batch_size", None)
    if total is None:
        return
    per_device, world = training_args.per_device_train_batch_size, training_args.world_size
    # transformers' count: train_batch_size is a process's batch, x its GPUs where one process drives several
    made = training_args.train_batch_size * world * training_args.gradient_accumulation_steps
    if made == total:
        return
    if training_args.train_batch_size != per_device:
        raise RecipeError(
            f"global_batch_size={total}: one process drives {training_args.n_gpu} GPUs (DataParallel), so a step "
            f"would see {made} images; launch one process per GPU (accelerate launch scripts/finetune.py ...)."
        )
    raise RecipeError(
        f"global_batch_size={total} but {per_device} per device x {world} process{'es' if world != 1 else ''} x "
        f"{training_args.gradient_accumulation_steps} accumulation steps make {made}; set gradient_accumulation_steps "
        f"to global_batch_size / ({per_device} x {world}), or leave it unset to derive it."
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


def check_evaluation(data_args: Any, training_args: TrainingArguments) -> None:
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


def check_distillation(training_args: Any) -> None:
    """The distillation settings come with a teacher (that the teacher exists is `model_flags.check_sources`')."""
    if training_args.teacher_model_name_or_path is None:
        given = [k for k in ("distillation_type", "distillation_alpha", "distillation_tau")
                 if getattr(training_args, k) is not None]  # fmt: skip
        if given:
            raise RecipeError(
                f"{given[0]} needs a teacher: set --teacher_model_name_or_path (e.g. outputs/digits), or drop it."
            )


def check_wise(model_args: Any, data_args: Any) -> None:
    """wise_ft interpolates with the model the fine-tune starts from, which must classify on its own (LP-FT's probe,
    a zero-shot head); wise_shift belongs to it."""
    if not getattr(data_args, "wise_ft", False):
        if getattr(data_args, "wise_shift", None) is not None:
            raise RecipeError("wise_shift is the shifted set of wise_ft's curve: add --wise_ft true, or drop it.")
        return
    if model_args.method not in ("lp-ft", "full"):
        raise RecipeError(f"wise_ft interpolates every weight of a full fine-tune with its start; method "
                          f"{model_args.method} is not one: use method lp-ft, or method full with head_init zeroshot.")  # fmt: skip
    if model_args.method == "full" and model_args.head_init != "zeroshot":
        raise RecipeError(
            f"wise_ft interpolates the fine-tune with the model it starts from, and method full with head_init "
            f"{model_args.head_init} starts from a zero head, which predicts nothing: use method lp-ft (the linear "
            "probe first) or head_init zeroshot (an image-text checkpoint), or drop wise_ft."
        )


def validate(model_args: Any, data_args: Any, training_args: TrainingArguments) -> None:
    """Every check across the arguments, once, cheapest first-to-fail order: pooling against the checkpoint,
    schedule, launch, global batch, push, evaluation setup, then the toolkit's keys (early stopping, EMA, class
    imbalance). (Each number's range was checked when its dataclass was built: `check_ranges`.)

    Needs no network, and reads neither the model nor the data: that they exist (here, in the Hub cache or on the
    Hub) is the fine-tune command's first check (`commands.model_flags.check_sources`); image folders are checked,
    naming the argument, when `vit_ft.data.datasets.load_image_datasets` loads them.
    """
    check_pooling(model_args)
    check_schedule(training_args)
    check_world_size(training_args)
    check_global_batch(training_args)
    check_push(training_args)
    check_evaluation(data_args, training_args)
    check_wise(model_args, data_args)
    refuse_batch_mixes(getattr(model_args, "max_num_patches", None), getattr(data_args, "mixes_batches", False))
    if hasattr(training_args, "ema_decay"):  # a FineTuneTrainingArguments, as parse_args makes
        check_early_stopping(training_args)
        check_ema(training_args)
        check_imbalance(training_args)
        check_distillation(training_args)


__all__ = [
    "CLASS_TOKEN_POOLINGS",
    "RecipeError",
    "check_early_stopping",
    "check_ema",
    "check_evaluation",
    "check_global_batch",
    "check_imbalance",
    "check_pooling",
    "check_push",
    "check_schedule",
    "check_wise",
    "check_world_size",
    "suggest",
    "validate",
]
