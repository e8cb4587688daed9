"""The fine-tune's Trainer callbacks: augmentation that replays on resume, the logging / eval / save steps of this
run's arguments on resume, training speed without evaluation, the training images skipped because they do not
decode, and the console: one readable line per evaluation instead of Trainer's raw log dicts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import has_length

from ..data.bad_images import BadImageTally, SkipBadImages, check_bad_fraction
from ..data.transforms import INDEX_COLUMN, ImageClassificationTransform
from ..utils.progress import Progress, duration, is_terminal

logger = logging.getLogger("vit_ft")


class AugmentationEpochCallback(TrainerCallback):
    """Sets the epoch of the train transform (and of the mixup / cutmix collator, any object with `set_epoch`)
    at each epoch's start, so that their augmentation replays on resume.

    The Trainer calls on_epoch_begin before it creates the epoch's DataLoader iterator (and the workers), and a
    run resumed mid-epoch starts at the checkpoint's epoch: that is the floor of state.epoch then, one more at
    each later epoch. Dropout needs nothing here: the Trainer restores the global RNG saved with the checkpoint.
    """

    def __init__(self, transform: ImageClassificationTransform, *others: Any) -> None:
        self.targets = (transform, *others)
        self.epoch: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.epoch = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        # state.epoch is a whole number at an epoch's start and epoch + fraction in a resumed one
        self.epoch = int(state.epoch) if self.epoch is None else self.epoch + 1
        for target in self.targets:
            target.set_epoch(self.epoch)


class StepsFromArguments(TrainerCallback):
    """The logging / eval / save steps of this run's arguments, on resume too.

    On resume the Trainer replaces its state with the checkpoint's trainer_state.json, steps included, and only
    warns when this run's arguments name others (`trainer_utils.compare_trainer_and_checkpoint_args`); a cadence
    that `--resume` allows to change (`resume.FREE`) is applied here, at the start of training, with the
    Trainer's own `TrainerState.compute_steps` (a fraction < 1 is of the whole run's steps). A fresh run's steps
    are already these.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        state.compute_steps(args, state.max_steps)


class EvaluationTime(TrainerCallback):
    """Adds up the seconds the Trainer spends evaluating inside `train()`, which its train_runtime includes."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.seconds = 0.0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.seconds += float((metrics or {}).get("eval_runtime", 0.0))

    def training_speed(self, train_metrics: dict[str, float]) -> dict[str, float]:
        """train_runtime and train_samples_per_second without the evaluation time (Trainer's keep it)."""
        runtime = train_metrics.get("train_runtime")
        if not runtime or runtime <= self.seconds:
            return {}
        training = runtime - self.seconds
        speed = {"train_runtime_excluding_eval": round(training, 4)}
        if "train_samples_per_second" in train_metrics:
            samples = train_metrics["train_samples_per_second"] * runtime
            speed["train_samples_per_second_excluding_eval"] = round(samples / training, 3)
        return speed


class BadImageCallback(TrainerCallback):
    """The training images skipped because they do not decode (`vit_ft.data.bad_images`): counted after each
    step, the run failed with one line once more than `max_fraction` of the `total` training images are bad, and
    the list kept for the run's record (`record`).

    `collator(collate)` wraps the training batches' collator so that it skips and records them; `describe(rows)`
    names the bad rows (source and reason; default: their row numbers). During training each process counts
    what its own DataLoader skipped; at the end the processes' rows are joined, checked again and logged.
    """

    def __init__(self, total: int, max_fraction: float,
                 describe: Callable[[list[int]], list[dict[str, Any]]] | None = None) -> None:  # fmt: skip
        self.total, self.max_fraction = int(total), float(max_fraction)
        self.tally = BadImageTally(self.total)
        self.describe = describe or (lambda rows: [{"row": row} for row in rows])
        self.skipped: list[int] | None = None  # every process's bad rows, once training ended
        self.from_step = 0  # the step training started at (a resumed run's checkpoint)
        self.named: dict[int, dict[str, Any]] = {}  # row -> {"row", "source", "reason"}, as the batches said

    def note(self, skipped: list[dict[str, Any]]) -> None:
        """Keep the names of the images a training batch dropped (`bad_images.BAD_IMAGES_KEY`, handed on by the
        trainer): a stream's rows cannot be named afterwards, a split's can but need not be."""
        for item in skipped:
            if item.get("row") is not None:
                row = int(item["row"]) % max(self.total, 1)  # the tally's row (a stream's hash folds into it)
                self.named[row] = {**item, "row": row}

    def collator(self, collate: Callable[[list[dict[str, Any]]], Any]) -> SkipBadImages:
        """`collate` behind the skip: the training batches' collator."""
        return SkipBadImages(collate, self.tally, INDEX_COLUMN)

    def on_train_begin(self, args, state, control, **kwargs):
        self.skipped, self.from_step = None, state.global_step  # a resumed run counts what it decodes itself

    def on_step_end(self, args, state, control, **kwargs):
        count = self.tally.count()  # cheap: one sum over a bitmap
        if count > self.max_fraction * self.total:
            check_bad_fraction(count, self.total, self.max_fraction, self._example(self.tally.rows()))

    def on_train_end(self, args, state, control, **kwargs):
        self.skipped = _joined_across_processes(self.tally.rows())
        for part in _gathered(self.named):  # the names other processes' batches gave
            self.named.update({int(row): item for row, item in part.items()})
        if not self.skipped:
            return
        example = self._example(self.skipped)
        check_bad_fraction(len(self.skipped), self.total, self.max_fraction, example)
        logger.warning(
            "Skipped %d of %d training images that do not decode, e.g. %s; vit_ft_run.json lists them.",
            len(self.skipped), self.total, example,
        )  # fmt: skip

    def _example(self, rows: list[int]) -> str:
        """The first bad row as "source (reason)" for a message; "" when there is none."""
        if not rows:
            return ""
        named = self._names(rows[:1])[0]
        return f"{named.get('source', f'row {rows[0]}')} ({named.get('reason', 'did not decode')})"

    def _names(self, rows: list[int]) -> list[dict[str, Any]]:
        """Each row's {"row", "source", "reason"}: as its batch named it, else as `describe` does."""
        missing = [row for row in rows if row not in self.named]
        described = dict(zip(missing, self.describe(missing), strict=True)) if missing else {}
        return [self.named.get(row) or described[row] for row in rows]

    def record(self, max_listed: int = 100) -> dict[str, Any]:
        """The run record's `bad_images`: how many training images were skipped, of how many, since which step
        (a resumed run's record covers the steps it ran: a later epoch decodes every image again), and the first
        `max_listed` of them (row, source, reason)."""
        skipped = self.skipped if self.skipped is not None else self.tally.rows()
        return {
            "skipped": len(skipped),
            "of": self.total,
            "max_bad_image_fraction": self.max_fraction,
            "counted_from_step": self.from_step,
            "images": self._names(skipped[:max_listed]),
        }


# ---- the console ------------------------------------------------------------------------------------------------

# Trainer's log keys that say how fast, not how good: left to the log history (trainer_state.json)
_SPEED_KEYS = ("_runtime", "_per_second", "total_flos")


def _headline_key(logs: dict[str, Any], args: Any) -> str | None:
    """The evaluation metric the run is judged by: metric_for_best_model, else accuracy or mAP, if logged."""
    wanted = getattr(args, "metric_for_best_model", None)
    names = [wanted, *(("accuracy", "mAP") if wanted is None else ())] if wanted else ["accuracy", "mAP"]
    for name in names:
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key in logs:
            return key
    return None


def _value(key: str, value: float) -> str:
    """An accuracy-like fraction as a percentage, anything else with 4 significant digits."""
    if key.endswith(("accuracy", "_f1", "mAP", "f1_micro", "f1_macro", "exact_match")) and 0 <= value <= 1:
        return f"{100 * value:.2f} %"
    return f"{value:.4g}"


def _where(state: Any) -> str:
    epochs = getattr(state, "num_train_epochs", 0)
    epoch = f"epoch {state.epoch:.3g}" + (f"/{epochs:g}" if epochs else "") if state.epoch is not None else ""
    steps = f"step {state.global_step}" + (f"/{state.max_steps}" if state.max_steps else "")
    return f"{epoch}, {steps}" if epoch else steps


def log_line(logs: dict[str, Any], state: Any, args: Any) -> str | None:
    """One readable line for one of Trainer's log dicts: an evaluation ("validation at epoch 2/30, step 40/600:
    accuracy 97.22 %, loss 0.1234; top5_accuracy 100.00 %, ..."), a training log ("epoch 2/30, step 40/600:
    loss 0.1234, learning rate 0.000291"); None for the run's closing speed summary, which the train metrics
    table shows."""
    if any(key.startswith("eval_") for key in logs):
        headline = _headline_key(logs, args)
        first = [key for key in (headline, "eval_loss") if key and key in logs]
        rest = [k for k in logs if k.startswith("eval_") and k not in first and not k.endswith(_SPEED_KEYS)]
        parts = [f"{key.removeprefix('eval_')} {_value(key, logs[key])}" for key in first]
        line = f"validation at {_where(state)}: " + ", ".join(parts)
        extra = ", ".join(f"{key.removeprefix('eval_')} {_value(key, logs[key])}" for key in rest)
        return f"{line}; {extra}" if extra else line
    if "loss" in logs:
        parts = [f"loss {logs['loss']:.4g}"]
        if "learning_rate" in logs:
            parts.append(f"learning rate {logs['learning_rate']:.3g}")
        return f"{_where(state)}: " + ", ".join(parts)
    return None


class ReadableProgress(ProgressCallback):
    """Trainer's progress bar (with its ETA), the training loss shown on the bar instead of a dict per log,
    and one `log_line` per evaluation written above it. The log history (trainer_state.json) is unchanged."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        if any(key.startswith("eval_") for key in logs):
            self.training_bar.write(log_line(logs, state, args))
        elif "loss" in logs:
            self.training_bar.set_postfix(loss=f"{logs['loss']:.4g}", refresh=False)


class ReadableLog(PrinterCallback):
    """Plain lines, for a log that is not a terminal (or with `disable_tqdm`): one `log_line` per log instead of
    Trainer's printed dicts, a training log with the steps' rate and the time left, and an evaluation's batches
    as `utils.progress.Progress` lines (no bar: escape codes and carriage returns would litter the log)."""

    def __init__(self) -> None:
        self.started: tuple[float, int] | None = None  # (time, step) where this process's training began
        self.evaluation: Progress | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = (time.perf_counter(), state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = log_line(logs or {}, state, args)
        if state.is_local_process_zero and line is not None:
            print(line + self._pace(logs or {}, state), flush=True)

    def _pace(self, logs: dict[str, Any], state: Any) -> str:
        """", 2.31 steps/s, 4 min 10 s left" for a training log; "" for any other."""
        if "loss" not in logs or self.started is None or not state.max_steps:
            return ""
        seconds, steps = time.perf_counter() - self.started[0], state.global_step - self.started[1]
        if seconds <= 0 or steps <= 0:
            return ""
        left = (state.max_steps - state.global_step) * seconds / steps
        return f", {steps / seconds:.3g} steps/s, {duration(left)} left"

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.evaluation is None:
            total = len(eval_dataloader) if eval_dataloader is not None and has_length(eval_dataloader) else None
            self.evaluation = Progress(total, "Evaluation", unit="batch")
        self.evaluation.update()

    def _end_evaluation(self) -> None:
        if self.evaluation is not None:
            self.evaluation.close()
            self.evaluation = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._end_evaluation()

    def on_predict(self, args, state, control, **kwargs):
        self._end_evaluation()


def use_readable_console(trainer: Any, terminal: bool | None = None) -> None:
    """Swap Trainer's printing of raw log dicts for `ReadableProgress` (its bar, on a terminal) or `ReadableLog`
    (plain lines: with disable_tqdm, or where stderr is not a terminal (`terminal`; None: find out), as under
    Slurm, nohup or `accelerate launch`'s pipe); another printer (a notebook's) is left as it is."""
    handler = trainer.callback_handler
    kinds = {type(callback) for callback in handler.callbacks}
    terminal = is_terminal() if terminal is None else terminal
    if ProgressCallback in kinds:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(ReadableProgress if terminal else ReadableLog)
    if PrinterCallback in kinds:
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(ReadableLog)


def _gathered(value: Any) -> list[Any]:
    """Every process's `value` (a several-process run); [`value`] in one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return [part for part in gathered if part is not None]


def _joined_across_processes(rows: list[int]) -> list[int]:
    """Every process's `rows`, joined and sorted (a several-process run); `rows` itself in one process."""
    return sorted({row for part in _gathered(rows) for row in part or []})


__all__ = [
    "AugmentationEpochCallback",
    "BadImageCallback",
    "EvaluationTime",
    "ReadableLog",
    "ReadableProgress",
    "StepsFromArguments",
    "log_line",
    "use_readable_console",
]
