"""The merge of a recipe and the flags into the values the argument dataclasses are built from (`merge_values`):
the TrainingArguments defaults the recipes rely on (`TRAINING_DEFAULTS`), the recipe (less its data source when
the flags name another), the flags, checkpoints kept on the evaluation schedule, the output folder, and last the
DataLoader's settings (`data_loading.resolve_data_loading`) and the accumulation a global batch derives
(`global_batch.resolve_global_batch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .data_loading import resolve_data_loading
from .global_batch import resolve_global_batch

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


__all__ = ["OUTPUT_ROOT", "TRAINING_DEFAULTS", "merge_values"]
