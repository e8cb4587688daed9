"""`FineTuneTrainingArguments`: transformers' `TrainingArguments` plus the fine-tuning toolkit's training keys.

Layer-wise learning-rate decay and the weight-decay exemptions (`vit_ft.training.optimizer`), an exponential
moving average of the weights (`vit_ft.training.ema`), early stopping (transformers' `EarlyStoppingCallback`)
and imbalanced classes (`vit_ft.training.imbalance`). A subclass, as TRL's `SFTConfig` extends TrainingArguments,
so that these are recipe keys and flags like `learning_rate`; each is off by default. `__post_init__` checks every
number against its range (`checks.RANGES`, transformers' fields too) and mixed precision against the hardware
(`check_precision`) before transformers' own, vaguer, checks and device errors, then each other value alone; the
checks across fields (patience needs a metric to watch, ...) are in `checks`.
`merge_values` layers a recipe and flags over the defaults the recipes rely on (`TRAINING_DEFAULTS`), the values
`recipes.parse_args` builds the three argument dataclasses from, with the DataLoader's settings resolved
(`resolve_data_loading`: `dataloader_num_workers: auto` becomes an int, persistent workers where a GPU trains)
and the accumulation derived from `global_batch_size` and the launch's world size (`resolve_global_batch`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainingArguments

from ..tasks.losses import BALANCED
from ..tasks.threshold import TUNE, TUNE_PER_CLASS
from ..utils.hardware import accelerator_type, auto_dataloader_workers, cores_per_process
from .checks import RANGES, VALUE_RANGES, RecipeError, check_ranges

# TrainingArguments defaults that the recipes rely on (a recipe or a flag still overrides each of them).
TRAINING_DEFAULTS: dict[str, Any] = {
    # the image column must reach the collator although the model's forward() does not name it
    "remove_unused_columns": False,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",  # load_best_model_at_end needs it equal to eval_strategy
    "load_best_model_at_end": True,
    "metric_for_best_model": "accuracy",
    "report_to": ["tensorboard"],
    # a peft-wrapped model hides `labels` from the forward() signature that Trainer inspects to find them
    "label_names": ["labels"],
    # every parameter takes part in every step; the DDP default (True) costs an extra graph traversal
    "ddp_find_unused_parameters": False,
}
OUTPUT_ROOT = "outputs"
AUTO_WORKERS = "auto"  # dataloader_num_workers' value for "one worker per core of this process, less one"
NUM_WORKERS_HELP = (
    "DataLoader worker processes: a number, 0 to load in the main process, or 'auto': one per CPU core of this "
    "process's share (its cores / the processes on this machine), less one for the main process."
)


def parse_num_workers(text: str) -> int | str:
    """`dataloader_num_workers` as a flag or recipe value: 'auto' or a whole number (its range is checked later)."""
    text = str(text).strip()
    return AUTO_WORKERS if text.lower() == AUTO_WORKERS else int(text)


parse_num_workers.__name__ = "'auto' or integer"  # argparse names the type in its error: "invalid <name> value"
parse_num_workers.expects = "auto or a whole number"  # a recipe's bad value says what it expects (recipes.coerce)


def resolve_data_loading(values: dict[str, Any], given: set[str], cuda: bool | None = None) -> dict[str, Any]:
    """`values` with `dataloader_num_workers: auto` resolved to an int (`utils.hardware.auto_dataloader_workers`)
    and, unless set in `given`, pinned memory on where a GPU trains and persistent workers where it trains with
    workers (`cuda`: whether one is present, default torch's answer). Before any TrainingArguments is built, so
    the Trainer's arguments only ever hold the number."""
    values = dict(values)
    if values.get("dataloader_num_workers") == AUTO_WORKERS:
        values["dataloader_num_workers"] = auto_dataloader_workers()
    gpu = (torch.cuda.is_available() if cuda is None else cuda) and not values.get("use_cpu", False)
    if "dataloader_persistent_workers" not in given:
        # workers kept between epochs (and evaluations): no start-up of N processes each time the GPU waits
        values["dataloader_persistent_workers"] = gpu and int(values.get("dataloader_num_workers") or 0) > 0
    if "dataloader_pin_memory" not in given:
        # pinned host memory only speeds up copies to a GPU; without one, torch warns about it every epoch
        values["dataloader_pin_memory"] = gpu
    return values


def launch_world_size(environ: dict[str, str] | None = None) -> int:
    """The processes of this launch, before any TrainingArguments exists: WORLD_SIZE (torchrun and `accelerate
    launch` set it), else the processes of an accelerate state already set up in this process, else 1."""
    environ = os.environ if environ is None else environ
    try:
        return max(1, int(environ["WORLD_SIZE"]))
    except (KeyError, ValueError):
        pass
    from accelerate.state import PartialState

    return PartialState().num_processes if PartialState._shared_state else 1


def resolve_global_batch(values: dict[str, Any], given: set[str], world_size: int | None = None) -> dict[str, Any]:
    """`values` with `gradient_accumulation_steps` derived from `global_batch_size` (when set): global /
    (per_device_train_batch_size x world size), the world size the launch's (`launch_world_size`). Refused in one
    line when it does not divide, or when an accumulation in `given` (a flag or recipe key) disagrees; one that
    agrees is kept. Unset: `values` unchanged (the global batch is then per device x processes x accumulation)."""
    total = values.get("global_batch_size")
    if total is None or not RANGES["global_batch_size"].allows(total):
        return values  # unset, or a bad number the dataclass refuses by its range
    per_device = values.get("per_device_train_batch_size", _TRAINING_FIELDS["per_device_train_batch_size"].default)
    if not RANGES["per_device_train_batch_size"].allows(per_device):
        return values
    world = launch_world_size() if world_size is None else world_size
    per_step = per_device * world
    if total % per_step:
        fits = [size for size in range(per_device, 0, -1) if total % (size * world) == 0]
        hint = f"--per_device_train_batch_size {fits[0]}" if fits else f"a number of processes that divides {total}"
        raise RecipeError(
            f"global_batch_size={total} is not a multiple of per_device_train_batch_size {per_device} x {world} "
            f"process{'es' if world != 1 else ''} = {per_step}; use {hint} (or a global_batch_size that is a multiple "
            f"of {per_step}), so that every optimizer step sees {total} images."
        )
    accumulation = total // per_step
    stated = values.get("gradient_accumulation_steps")
    if "gradient_accumulation_steps" in given and stated is not None and stated != accumulation:
        raise RecipeError(
            f"gradient_accumulation_steps={stated} disagrees with global_batch_size={total}: {per_device} per device "
            f"x {world} process{'es' if world != 1 else ''} needs {accumulation}; drop gradient_accumulation_steps "
            f"(it is derived), or set --global_batch_size {per_step * stated} (none: no global batch, the "
            "accumulation as given)."
        )
    return {**values, "gradient_accumulation_steps": accumulation}


def batch_record(args: TrainingArguments) -> dict[str, Any]:
    """World size, per-device batch, accumulation and the global batch they make as transformers counts it
    (`train_batch_size`: a process's batch, x its GPUs where one process drives several), the run record's `batch`;
    `global_batch_size` is the recipe's statement of it, None where the recipe stated none."""
    accumulation = args.gradient_accumulation_steps
    return {
        "world_size": args.world_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": accumulation,
        "global_batch": args.train_batch_size * args.world_size * accumulation,
        "global_batch_size": getattr(args, "global_batch_size", None),
    }


def describe_batch(args: TrainingArguments) -> str:
    """The batch in one log line: global = per device x processes x accumulation, and where it came from."""
    record = batch_record(args)
    source = (
        f"global_batch_size: {record['global_batch_size']}, the accumulation derived"
        if record["global_batch_size"] is not None
        else "no global_batch_size: it grows with the number of processes"
    )
    return (
        f"Batch: global {record['global_batch']} = {record['per_device_train_batch_size']} per device x "
        f"{record['world_size']} process{'es' if record['world_size'] != 1 else ''} (world size) x "
        f"{record['gradient_accumulation_steps']} accumulation step"
        f"{'s' if record['gradient_accumulation_steps'] != 1 else ''} ({source})."
    )


def describe_data_loading(args: TrainingArguments) -> str:
    """The DataLoader settings in one log line, with the cores they were chosen from."""
    workers = args.dataloader_num_workers
    prefetch = args.dataloader_prefetch_factor or 2  # torch's default with workers
    loading = (
        f"prefetch {prefetch} batch{'es' if prefetch != 1 else ''} a worker" if workers else "batches loaded in "
        "the main process"
    )
    return (
        f"Data loading: {workers} worker{'s' if workers != 1 else ''} per process ({cores_per_process()} CPU "
        f"cores per process here; dataloader_num_workers: {AUTO_WORKERS} gives {auto_dataloader_workers()}, one "
        f"core left for the main process), {loading}, pinned memory {'on' if args.dataloader_pin_memory else 'off'}"
        f", persistent workers {'on' if args.dataloader_persistent_workers else 'off'}."
    )


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


def precision_of(training_args: Any, device_type: str | None = None) -> tuple[str, bool, bool]:
    """The run's device type, and whether fp16 and bf16 are set (for training or evaluation)."""
    use_cpu = bool(getattr(training_args, "use_cpu", False))
    device = "cpu" if use_cpu else (device_type or accelerator_type())
    fp16 = bool(getattr(training_args, "fp16", False) or getattr(training_args, "fp16_full_eval", False))
    bf16 = bool(getattr(training_args, "bf16", False) or getattr(training_args, "bf16_full_eval", False))
    return device, fp16, bf16


def check_precision(training_args: Any, device_type: str | None = None) -> None:
    """Fail early on a mixed precision the hardware cannot run: fp16 without a GPU, bf16 on CPU without use_cpu.
    bf16 on a CPU without native bf16 products runs (emulated, with a warning: `plan.run_compute`).

    `training_args` is a TrainingArguments or anything with its fp16/bf16/use_cpu attributes; `device_type`
    ("cuda", "cpu", ...) defaults to the accelerator torch finds.
    """
    use_cpu = bool(getattr(training_args, "use_cpu", False))
    device, fp16, bf16 = precision_of(training_args, device_type)
    if fp16 and device == "cpu":
        where = "use_cpu is set" if use_cpu else "no GPU was found"
        raise RecipeError(
            f"fp16 mixed precision needs a CUDA GPU, but {where}. Use bf16 instead (--fp16 false --bf16 true, "
            "adding --use_cpu true on CPU) or drop fp16 (--fp16 false) to train in fp32."
        )
    if bf16 and device == "cpu" and not use_cpu:
        raise RecipeError(
            "bf16 is set but no GPU was found. Drop it (--bf16 false) to train in fp32 on CPU, or pass "
            "--use_cpu true to train with CPU bf16 autocast."
        )
    if bf16 and device == "cuda" and device_type is None and not torch.cuda.is_bf16_supported():
        raise RecipeError(
            "bf16 needs an Ampere or newer GPU; this one has none. Use --bf16 false --fp16 true."
        )


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

    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Distil from this fine-tuned classifier (DeiT): a vit_ft output folder (e.g. outputs/digits), a "
            "transformers image classifier or a Hub id of one, with the data's classes. It runs in eval mode on "
            "each augmented training batch; a student with a distillation token learns it with that head, "
            "one without on its logits. None: off."
        },
    )
    distillation_type: str | None = field(
        default=None,
        metadata={
            "help": "DeiT's distillation: 'hard' (cross-entropy with the teacher's top class; DeiT's best) or "
            "'soft' (KL divergence at distillation_tau). Unset: hard, with a teacher."
        },
    )
    distillation_alpha: float | None = field(
        default=None,
        metadata={"help": "The teacher's share of the loss, in [0, 1]: (1 - alpha) labels + alpha teacher. Unset: 0.5."},
    )
    distillation_tau: float | None = field(
        default=None,
        metadata={"help": "The soft distillation's temperature, > 0. Unset: 1.0 (DeiT's)."},
    )

    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Images per optimizer step over all processes (the recipe's contract: the ViT paper's 512). "
            "gradient_accumulation_steps is derived: global_batch_size / (per_device_train_batch_size x processes); "
            "refused when it does not divide, or beside a gradient_accumulation_steps that disagrees. None: "
            "per_device_train_batch_size x processes x gradient_accumulation_steps (grows with the processes)."
        },
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


_PAIRED = (("eval_strategy", "save_strategy"), ("eval_steps", "save_steps"))


# A recipe's data source: one of these given on the command line replaces all of them from the recipe.
_DATA_SOURCE_KEYS = (
    "dataset_name",
    "dataset_config",
    "train_dir",
    "validation_dir",
    "test_dir",
    "builtin_dataset",
)


def _without_recipe_data(recipe_values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The recipe's values minus its data source when the flags name another (--train_dir or --dataset_name).

    `--recipe digits --train_dir my/train` trains on my/train: the recipe's built-in dataset, its folders and
    its test folder no longer apply (flags given beside the new source, e.g. --test_dir, still do).
    """
    if flags.get("train_dir") is None and flags.get("dataset_name") is None:
        return recipe_values
    return {key: value for key, value in recipe_values.items() if key not in _DATA_SOURCE_KEYS}


def merge_values(recipe: dict[str, Any], flags: dict[str, Any], name: str | None) -> dict[str, Any]:
    """The values of the argument dataclasses: TRAINING_DEFAULTS, then the recipe's values (less its data source
    when the flags name another), then the flags, keeping checkpoints on the eval schedule; the output folder
    defaults to outputs/<recipe name>; the DataLoader's settings and the accumulation resolved last
    (`resolve_data_loading`, `resolve_global_batch`: a `--global_batch_size` flag replaces the recipe's
    accumulation, a recipe's or flag's accumulation beside a global batch of the same layer or later must agree).

    load_best_model_at_end needs saving and evaluation on the same schedule, so when a layer sets only one side
    of a pair (eval_strategy/save_strategy, eval_steps/save_steps) and the other side was unset or equal, the other
    side follows. "no" and "best" do not propagate; with either schedule off, load_best_model_at_end defaults to off.
    """
    values: dict[str, Any] = dict(TRAINING_DEFAULTS, output_dir=str(Path(OUTPUT_ROOT) / (name or "vit-ft")))
    given: set[str] = set()
    for layer in (_without_recipe_data(recipe, flags), flags):
        updated = {**values, **layer}
        for first, second in _PAIRED:
            for source, target in ((first, second), (second, first)):
                if source not in layer or target in layer or str(layer[source]) in ("no", "best"):
                    continue
                if target not in given or values.get(target) == values.get(source):
                    updated[target] = layer[source]
        values = updated
        given |= set(layer)
    # a flag giving one of these replaces a recipe's other: `method` and `use_lora` say one thing (`--method auto`
    # on a LoRA recipe; both as flags must agree, `ModelArguments`); a recipe's built-in pre-training builds the
    # recipe's own checkpoint, so a --model_name_or_path flag names one that must exist (a mistyped folder fails
    # at once instead of being pre-trained into) unless --pretrain_if_missing is given too
    for one, other in (("method", "use_lora"), ("use_lora", "method"), ("model_name_or_path", "pretrain_if_missing")):
        if one in flags and other not in flags:
            values.pop(other, None)
    if "load_best_model_at_end" not in given and "no" in (
        str(values["eval_strategy"]),
        str(values["save_strategy"]),
    ):
        values["load_best_model_at_end"] = False
    # a global batch given as a flag replaces the recipe's accumulation; an accumulation flag beside it must agree
    replaced = "global_batch_size" in flags and "gradient_accumulation_steps" not in flags
    stated = given - {"gradient_accumulation_steps"} if replaced else given
    return resolve_global_batch(resolve_data_loading(values, given), stated)


_TRAINING_FIELDS = TrainingArguments.__dataclass_fields__


__all__ = [
    "AUTO_WORKERS",
    "BALANCED",
    "NUM_WORKERS_HELP",
    "OUTPUT_ROOT",
    "TRAINING_DEFAULTS",
    "TUNE",
    "TUNE_PER_CLASS",
    "FineTuneTrainingArguments",
    "batch_record",
    "check_precision",
    "describe_batch",
    "describe_data_loading",
    "launch_world_size",
    "merge_values",
    "parse_class_weights",
    "parse_decision_threshold",
    "parse_num_workers",
    "precision_of",
    "resolve_data_loading",
    "resolve_global_batch",
]
