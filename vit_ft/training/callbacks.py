"""The fine-tune's Trainer callbacks: augmentation that replays on resume, the logging / eval / save steps of this
run's arguments on resume, and training speed without evaluation."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ..data.transforms import ImageClassificationTransform


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


__all__ = ["AugmentationEpochCallback", "EvaluationTime", "StepsFromArguments"]
