"""`method: auto`, the ladder: the cheapest method that works, climbed from frozen features to full fine-tuning.

The rungs, cheapest first: an image-text checkpoint's zero-shot head (CLIP, SigLIP: no training; only for those),
the kNN vote and the linear probe on the frozen backbone (seconds), a parameter-efficient rung (minutes: the
checkpoint family's, `arguments.method_defaults.LADDER_PEFT_RUNGS` with its source: SSF for the ViT by V-PETL
Bench's ranking, else LoRA; its targets and rank the family's row where the run leaves them at their defaults),
full fine-tuning (the recipe's own schedule). Each rung is one fine-tune (`stages.run_finetune`) into
`OUTPUT/ladder/<rung>/`; the kNN rung always runs, and each later rung only when the rung before it gained more
than `ladder_min_gain` points of the task's validation metric (accuracy, or mAP for several labels per image)
over the best rung before that, and while the time spent is within `budget_minutes` (the clock is a parameter:
tests give their own). The winner on validation (ties: the cheaper rung) is copied into OUTPUT, so the folder
is the best rung's model for predict, evaluate and export; `report.md` and `ladder.json` there show each rung's
validation and test result and time, and why the ladder stopped.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..arguments.family_defaults import checkpoint_family
from ..arguments.fields import ModelArguments
from ..arguments.method_defaults import METHOD_DEFAULTS, ladder_peft_rung, method_values
from ..tasks import MultiLabel, SingleLabel
from ..utils.files import write_text_atomically

logger = logging.getLogger("vit_ft")

RUNGS = ("knn", "linear", "lora", "full")  # cheapest first; "lora" stands for the family's parameter-efficient rung
LADDER_FOLDER = "ladder"
LADDER_FILES = ("report.md", "ladder.json")
METRICS = (SingleLabel.best_metric, MultiLabel.best_metric)  # the tasks' headline metrics (accuracy, mAP)


@dataclass
class Rung:
    """One rung of the ladder: what ran (or why not), its validation / test metric and its time."""

    method: str
    ran: bool = False
    validation: float | None = None
    test: float | None = None
    seconds: float = 0.0
    why: str = ""
    metrics: dict[str, float] | None = None


def headline(metrics: dict[str, float], prefix: str) -> float | None:
    """The task's headline metric of a split (`eval` or `test`) in a fine-tune's metrics, or None."""
    for name in METRICS:
        if f"{prefix}_{name}" in metrics:
            return float(metrics[f"{prefix}_{name}"])
    return None


def next_rung_reason(rungs: list[Rung], min_gain: float, spent: float, budget: float | None) -> str:
    """"" when the ladder climbs to the next rung, else why it stops there (one phrase for the report)."""
    last = rungs[-1]
    if last.validation is None:
        return f"{last.method} gave no validation metric (no validation split) to judge its gain by"
    before = [rung.validation for rung in rungs[:-1] if rung.validation is not None]
    if before:  # the first rung (kNN) always leads on to the linear probe
        gain = round(100 * (last.validation - max(before)), 6)  # 0.51 - 0.50 is one point, not 1.0000000000000009
        if gain <= min_gain:
            return f"{last.method} gained {gain:+.2f} points over the rungs below, not above ladder_min_gain {min_gain:g}"
    if budget is not None and spent >= budget * 60:
        return f"the budget of {budget:g} minutes was spent ({spent / 60:.1f} minutes)"
    return ""


def run_ladder(
    model_args: ModelArguments,
    training_args: Any,
    run_rung: Callable[[ModelArguments, Any], dict[str, float]],
    overwrite_output_dir: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, float]:
    """Climb the ladder into `training_args.output_dir` (see the module's docstring), each rung a fine-tune by
    `run_rung(model_args, training_args)` (the stages' `run_finetune` on the run's data, handed in: the stages call
    the ladder); returns the best rung's metrics with `ladder_method` (its index in RUNGS, the family's
    parameter-efficient rung at LoRA's; -1 for the zero-shot head)."""
    from .checkpoints import check_run_output_dir

    check_run_output_dir(training_args, overwrite_output_dir)  # the winner's files will be copied there
    output_dir = Path(training_args.output_dir)
    family = checkpoint_family(model_args.model_name_or_path, model_args.cache_dir)
    start, rungs, skipped, names = clock(), [], [], ladder_rungs(model_args, family)
    for method in names:
        if rungs:
            why = next_rung_reason(rungs, model_args.ladder_min_gain, clock() - start, model_args.budget_minutes)
            if why:
                rest = names[names.index(method):]
                rungs += [Rung(other, why=why if other == method else "not reached") for other in rest]
                break
        rung_model = rung_arguments(model_args, method, family)
        rung_training = copy.copy(training_args)
        rung_training.output_dir = str(output_dir / LADDER_FOLDER / method)
        began = clock()
        logger.info("Ladder: %s (%s).", method, rung_training.output_dir)
        try:
            metrics = run_rung(rung_model, rung_training)
        except ValueError as error:  # the zero-shot head where it cannot be (multi-label data): the rungs go on
            if method != "zeroshot":
                raise
            skipped.append(Rung(method, why=f"not run: {error}"))
            continue
        rungs.append(Rung(method, True, headline(metrics, "eval"), headline(metrics, "test"), clock() - began,
                          metrics=metrics))  # fmt: skip
    rungs = skipped + rungs
    best = max((rung for rung in rungs if rung.ran), key=lambda r: -1.0 if r.validation is None else r.validation)
    if training_args.process_index == 0:
        _copy_winner(output_dir / LADDER_FOLDER / best.method, output_dir)
        write_ladder_report(output_dir, rungs, best, model_args, family)
    logger.info("Ladder: %s kept (validation %s); %s.", best.method, _percent(best.validation),
                output_dir / "report.md")  # fmt: skip
    index = -1.0 if best.method == "zeroshot" else float(names.index(best.method) - (names[0] == "zeroshot"))
    return {**(best.metrics or {}), "ladder_method": index}


def ladder_rungs(model_args: ModelArguments, family: str | None) -> tuple[str, ...]:
    """The rungs of this run: RUNGS with `family`'s (the checkpoint's) parameter-efficient rung in LoRA's place, below
    them the zero-shot head (`method: zeroshot`, no training) where the checkpoint is a whole image-text model (its
    text tower classifies from the class names)."""
    from ..model.zeroshot import has_text_tower

    peft_rung, _ = ladder_peft_rung(family)
    rungs = tuple(peft_rung if rung == "lora" else rung for rung in RUNGS)
    return ("zeroshot", *rungs) if has_text_tower(model_args.model_name_or_path, model_args.cache_dir) else rungs


def rung_arguments(model_args: ModelArguments, method: str, family: str | None) -> ModelArguments:
    """The model arguments of one rung: `method`, and for a peft method its row for `family` (targets, rank:
    `arguments.method_defaults`) in each key the run left at its default; the learning rate stays the run's."""
    rung_model = copy.copy(model_args)  # not dataclasses.replace: the arguments are checked already
    rung_model.method, rung_model.use_lora = method, method == "lora"
    if method in METHOD_DEFAULTS:
        defaults = {field.name: field.default for field in dataclasses.fields(ModelArguments)}
        for key, value in method_values(method, family).items():
            if key in defaults and getattr(rung_model, key) == defaults[key]:
                setattr(rung_model, key, value)
    return rung_model


def _copy_winner(source: Path, output_dir: Path) -> None:
    """The best rung's model, records and examples into the ladder's folder (its checkpoints stay where they are);
    a previous winner's adapter / examples there go first (an old LoRA adapter beside a new probe would mislead)."""
    for name in ("examples", "adapter"):
        if (output_dir / name).is_dir():
            shutil.rmtree(output_dir / name)
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, output_dir / path.name)
        elif path.name in ("examples", "adapter"):
            shutil.copytree(path, output_dir / path.name, dirs_exist_ok=True)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def write_ladder_report(
    output_dir: Path, rungs: list[Rung], best: Rung, model_args: ModelArguments, family: str | None = None
) -> None:
    """`report.md` (the rungs as a table, the parameter-efficient rung taken and why) and `ladder.json`."""
    budget = "none" if model_args.budget_minutes is None else f"{model_args.budget_minutes:g} minutes"
    peft_rung, why = ladder_peft_rung(family)
    lines = [
        "# The ladder (`--method auto`)",
        "",
        f"Kept: **{best.method}** (best validation). A rung was taken when the rung before it gained more than "
        f"ladder_min_gain = {model_args.ladder_min_gain:g} points over those below it; budget: {budget}.",
        "",
        f"Parameter-efficient rung: **{peft_rung}** (checkpoint family: {family or 'unknown'}; {why}).",
        "",
        "| rung | ran | validation (%) | test (%) | time (s) | folder / why not |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rung in rungs:
        where = f"`{LADDER_FOLDER}/{rung.method}/`" if rung.ran else rung.why
        lines.append(f"| {rung.method} | {'yes' if rung.ran else 'no'} | {_percent(rung.validation)} | "
                     f"{_percent(rung.test)} | {rung.seconds:.1f} | {where} |")  # fmt: skip
    stopped = next((rung.why for rung in rungs if not rung.ran and rung.why not in ("not reached",)
                    and not rung.why.startswith("not run:")), "")  # fmt: skip
    if stopped:
        lines += ["", f"Stopped: {stopped}."]
    write_text_atomically(output_dir / "report.md", "\n".join(lines) + "\n")
    record = {"kept": best.method, "peft_rung": {"method": peft_rung, "family": family, "source": why},
              "ladder_min_gain": model_args.ladder_min_gain,
              "budget_minutes": model_args.budget_minutes,
              "rungs": [{"method": r.method, "ran": r.ran, "validation": r.validation, "test": r.test,
                         "seconds": round(r.seconds, 3), "why": r.why} for r in rungs]}  # fmt: skip
    write_text_atomically(output_dir / "ladder.json", json.dumps(record, indent=2) + "\n")


__all__ = ["LADDER_FILES", "LADDER_FOLDER", "RUNGS", "Rung", "headline", "ladder_rungs", "next_rung_reason", "run_ladder",
           "rung_arguments"]  # fmt: skip
