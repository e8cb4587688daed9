"""The fine-tune's Trainer: transformers' `Trainer` plus the toolkit's training pieces, and the final evaluation.

`FineTuneTrainer` adds, each only when its recipe key is on: parameter groups with layer-wise learning-rate decay
and the weight-decay exemptions for whichever optimizer `optim` names (`optimizer`), the class-balanced sampler
(`sampler`), a training-only collator (mixup / cutmix: evaluation batches are never mixed, so accuracy is measured
on the hard labels), the per-batch augmentation on the training device (`batch_augmentation`: flip,
RandAugment, erasing, normalisation and mixup of each training micro-batch of uint8 crops, in `training_step`,
which evaluation never calls), and the EMA's evaluation beside the model's (`ema`: `eval_ema_*` in the same log entry, so
`metric_for_best_model: ema_accuracy` and early stopping can watch it). `build_trainer` puts it together from the
arguments; `evaluate_final_model` reports the weights the run ends with.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import EarlyStoppingCallback, Trainer, TrainingArguments

from ..arguments.data_loading import data_seed
from ..data.bad_images import BAD_IMAGES_KEY
from ..data.batch_augmentation import BatchAugmentation
from ..data.collate import collate_fn
from ..data.mixup import MixupCutmix
from ..data.training_split import train_dataloader
from .callbacks import AugmentationEpochCallback, EvaluationTime
from .distillation import Distiller, build_distiller
from .ema import EMACallback
from .optimizer import build_optimizer, wants_own_groups
from .sampler import ClassBalancedSampler
from .workers import shielded_from_preemption, with_own_generator


class FineTuneTrainer(Trainer):
    """Trainer with layer-decay parameter groups, a balanced sampler, a train-only collator and EMA evaluation.

    Args beyond Trainer's: `ema` (an `EMACallback`, also to be registered as a callback), `train_collator`
    (the training batches' collator; `data_collator` stays the evaluation one), `batch_augmentation` (a
    `vit_ft.data.batch_augmentation.BatchAugmentation`: its `collate` becomes the training collator and it
    runs on each training micro-batch once on the device), `balanced_labels` (the training labels, for
    `ClassBalancedSampler`; None: Trainer's sampler).
    """

    # compute_loss_func (ClassificationLoss) returns a per-batch mean, as the model's own loss: Trainer divides
    # it by the accumulation steps and never multiplies it by the number of processes.
    loss_is_scaled_for_ga = False

    def __init__(self, *args: Any, ema: EMACallback | None = None, train_collator: Any = None,
                 batch_augmentation: BatchAugmentation | None = None, balanced_labels: list[int] | None = None,
                 distiller: Distiller | None = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.distiller = distiller
        self.ema, self.train_collator, self.balanced_labels = ema, train_collator, balanced_labels
        self.batch_augmentation = batch_augmentation
        self.bad_images: Any = None  # the run's BadImageCallback, which keeps the skipped images' names
        if batch_augmentation is not None and train_collator is None:
            self.train_collator = batch_augmentation.collate  # keeps the image indices the draws need

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:  # fmt: skip
        # Here rather than in the collator: on the training device, once per micro-batch (gradient accumulation
        # included), never in evaluation (prediction_step); Trainer's own _prepare_inputs is then a no-op.
        skipped = inputs.pop(BAD_IMAGES_KEY, None)  # images the collator dropped, named: not the model's input
        if skipped and self.bad_images is not None:
            self.bad_images.note(skipped)
        if self.batch_augmentation is not None:
            inputs = self.batch_augmentation(self._prepare_inputs(inputs))
        if self.distiller is not None:  # the teacher sees the very pixels the student is about to see
            inputs = self._prepare_inputs(inputs)
            self.distiller.see(inputs["pixel_values"])
        return super().training_step(model, inputs, num_items_in_batch)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        # FSDP with SHARDED_STATE_DICT: a checkpoint keeps Trainer's shards (pytorch_model_fsdp_0/), which Trainer
        # saves nothing else for; the final model is gathered into one model.safetensors that from_pretrained loads
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if _internal_call or plugin is None or "SHARDED_STATE_DICT" not in str(plugin.state_dict_type):
            return super().save_model(output_dir, _internal_call)
        state_dict = self.accelerator.get_state_dict(self.model)  # every process takes part; process 0 holds it
        if self.args.should_save:
            self._save(output_dir or self.args.output_dir, state_dict=state_dict)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        # fully_shard makes the model's class a subclass of torch's FSDPModule, defined in torch's files: saved
        # as it is, the folder's code would be those files. Saved as its own class (state_dict is whole here).
        from torch.distributed.fsdp import FSDPModule

        model, sharded_class = self.model, type(self.model)
        if not isinstance(model, FSDPModule):
            return super()._save(output_dir, state_dict)
        model.__class__ = next(c for c in sharded_class.__mro__[1:] if not issubclass(c, FSDPModule))
        try:
            super()._save(output_dir, state_dict)
        finally:
            model.__class__ = sharded_class

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None and wants_own_groups(self.args):
            opt_model = self.model if model is None else model
            optimizer_cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(
                self.args, opt_model
            )
            self.optimizer = build_optimizer(opt_model, optimizer_cls, kwargs, self.args)
        return super().create_optimizer(model)  # keeps ours; wraps it where Trainer does (SageMaker)

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        if self.balanced_labels is None:
            return super()._get_train_sampler(train_dataset)
        seed = data_seed(self.args)
        return ClassBalancedSampler(self.balanced_labels, seed)

    def _get_dataloader(self, *args: Any, **kwargs: Any) -> torch.utils.data.DataLoader:
        # every loader (train, eval, test) with its own generator: the workers then change no draw of dropout
        loader = with_own_generator(super()._get_dataloader(*args, **kwargs), self.args.seed)
        return shielded_from_preemption(loader)  # its workers leave SIGTERM to this process, which saves first

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        # with persistent workers Trainer caches one loader under "eval" whatever dataset it is given: the test
        # split would be evaluated on the validation loader. Another dataset gets a loader of its own.
        if eval_dataset is None or isinstance(eval_dataset, str) or eval_dataset is self.eval_dataset:
            return super().get_eval_dataloader(eval_dataset)
        cached = self.__dict__.pop("_eval_dataloaders", None)
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.__dict__.pop("_eval_dataloaders", None)
            if cached is not None:
                self._eval_dataloaders = cached

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        # a stream's own loader, split per process already: not re-sharded
        loader = train_dataloader(self.train_dataset, self.train_collator or self.data_collator, self.args)
        if loader is not None:
            return shielded_from_preemption(loader)
        if self.train_collator is None:
            return super().get_train_dataloader()
        eval_collator, self.data_collator = self.data_collator, self.train_collator
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = eval_collator

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):  # fmt: skip
        output = super().evaluation_loop(
            dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
        )
        if self.ema is None or not self.ema.evaluating:
            return output
        with self.ema.ema.applied_to(self.model):
            ema_output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, f"{metric_key_prefix}_ema"
            )
        output.metrics.update(ema_output.metrics)
        return output


def build_trainer(
    model: Any,
    processor: Any,
    splits: datasets.DatasetDict,
    training_args: TrainingArguments,
    data_args: Any,
    task: Any,
    epoch_targets: list[Any],
    loss_weights: torch.Tensor | None = None,
    train_collator: Any = None,
    resume: str | None = None,
    balanced_labels: list[int] | None = None,
    skip_bad_images: Callable[[Callable[[list[dict[str, Any]]], Any]], Any] | None = None,
    names: list[str] | None = None,
) -> tuple[FineTuneTrainer, EvaluationTime]:
    """The Trainer over the train and validation splits, and the callback that times its evaluations.

    The `task` (`vit_ft.tasks`) gives the loss (with `loss_weights`: class weights, or BCE positive weights),
    and the metrics; `balanced_labels` (the task's `train_labels`, read before the transforms) feed the balanced
    sampler when the recipe asks for it; `epoch_targets` (the seeded train transform, the mixup collator) get each
    epoch's number at its start. When the train transform (the first target) returns uint8 crops
    (`device_augmentation`), its flip, augmentation and normalisation, and the mixup of the `MixupCutmix` among
    the targets (then not in `train_collator`), run per batch on the device (`BatchAugmentation`, see
    `FineTuneTrainer`). `skip_bad_images` (`BadImageCallback.collator`) wraps whichever training collator that
    leaves, so that images that do not decode are dropped before it. With `teacher_model_name_or_path`, the loss
    becomes DeiT's distillation loss over the task's (`distillation`; `names` are the classes the teacher must
    predict). `resume` is the checkpoint the EMA is read from. It never pushes (`_loss`).
    """
    loss, distiller, trainer_args = _loss(model, training_args, data_args, task, loss_weights, names)
    batch_augmentation = _batch_augmentation(epoch_targets)
    if batch_augmentation is not None:  # the mix moves to the device; the collator keeps the images' indices
        epoch_targets, train_collator = [*epoch_targets, batch_augmentation], batch_augmentation.collate
    if skip_bad_images is not None:
        train_collator = skip_bad_images(train_collator or collate_fn)
    callbacks, ema, evaluation_time = _callbacks(training_args, epoch_targets, resume)
    balanced = balanced_labels if getattr(training_args, "balanced_sampler", False) else None
    trainer = FineTuneTrainer(
        model=model,
        args=trainer_args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        data_collator=collate_fn,
        compute_metrics=task.compute_metrics(training_args),
        compute_loss_func=loss,
        processing_class=processor,
        callbacks=callbacks,
        ema=ema,
        train_collator=train_collator,
        batch_augmentation=batch_augmentation,
        balanced_labels=balanced,
        distiller=distiller,
    )
    return trainer, evaluation_time


def _loss(
    model: Any, training_args: TrainingArguments, data_args: Any, task: Any, loss_weights: torch.Tensor | None,
    names: list[str] | None,
) -> tuple[Any, Distiller | None, TrainingArguments]:  # fmt: skip
    """The training loss (None: the model's own, and Trainer's label smoothing, unless weights or mixed batches
    need the task's; DeiT's distillation loss over it with a teacher), its distiller, and the Trainer's arguments
    (never pushing: the finished folder is pushed once, with our card, by the fine-tune command)."""
    trainer_args = copy.copy(training_args)
    trainer_args.push_to_hub = False
    loss = task.training_loss(training_args, data_args, loss_weights)
    distiller = build_distiller(model, training_args, names or [], task, loss)
    if distiller is not None:
        loss = distiller.loss
    if loss is not None:
        trainer_args.label_smoothing_factor = 0.0  # in the loss or the mixed targets: never twice
        trainer_args.average_tokens_across_devices = False  # the loss is a per-batch mean, not a sum
    return loss, distiller, trainer_args


def _callbacks(
    training_args: TrainingArguments, epoch_targets: list[Any], resume: str | None
) -> tuple[list[Any], EMACallback | None, EvaluationTime]:
    """The Trainer's own callbacks: each epoch's number to `epoch_targets`, the evaluations' time, the EMA (read
    from `resume`'s checkpoint) and early stopping where the recipe asks; the EMA and the timing returned too."""
    evaluation_time = EvaluationTime()
    callbacks = [AugmentationEpochCallback(*epoch_targets), evaluation_time]
    ema = None
    if getattr(training_args, "ema_decay", None) is not None:
        args = training_args
        ema = EMACallback(args.ema_decay, args.ema_warmup, args.ema_as_final_model, resume)
        # before stages adds the checkpoint record's callback, so that the record covers ema.safetensors
        callbacks.append(ema)
    if getattr(training_args, "early_stopping_patience", None) is not None:
        patience, threshold = training_args.early_stopping_patience, training_args.early_stopping_threshold
        callbacks.append(EarlyStoppingCallback(patience, threshold))
    return callbacks, ema, evaluation_time


def _batch_augmentation(epoch_targets: list[Any]) -> BatchAugmentation | None:
    """The per-batch device augmentation for a train transform that returns uint8 crops, with the targets'
    mixup; None for a transform that does everything in the workers."""
    transform, *others = epoch_targets
    if not getattr(transform, "crops_only", False):
        return None
    mixup = next((target for target in others if isinstance(target, MixupCutmix)), None)
    return BatchAugmentation(transform, mixup)


def evaluated_final_model(state: Any, args: Any) -> dict[str, float] | None:
    """The validation metrics the Trainer logged for the weights the run ends with, if it evaluated them.

    Those weights are the best checkpoint's when load_best_model_at_end loaded it, else the last step's; with
    `ema_as_final_model` they are the EMA's, logged as eval_ema_* and returned as eval_*. None when that step was
    never evaluated (then evaluate once more).
    """
    step = state.global_step
    if args.load_best_model_at_end and state.best_model_checkpoint:
        step = int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1])
    ema_final = getattr(args, "ema_as_final_model", False)
    for entry in reversed(state.log_history):
        if entry.get("step") == step and "eval_loss" in entry:
            metrics = {k: v for k, v in entry.items() if k.startswith("eval_")}
            if ema_final:  # the EMA's numbers under the model's names; the timings are the pass's
                timings = {k: v for k, v in metrics.items() if k.endswith(("_runtime", "_per_second"))}
                ema = {
                    "eval_" + k.removeprefix("eval_ema_"): v
                    for k, v in metrics.items()
                    if k.startswith("eval_ema_")
                }
                metrics = ema | timings
            return metrics | {"epoch": state.epoch}
    return None


def evaluate_final_model(
    trainer: Trainer, splits: datasets.DatasetDict, reuse: bool = True
) -> dict[str, float]:
    """Validation (and test) metrics of the weights the run ends with, each logged and saved.

    The best model is loaded at the end when load_best_model_at_end; a validation pass already made on the final
    weights during training is reused, not repeated, unless `reuse` is False (a multi-label run's metrics
    changed with the tuned threshold).
    """
    metrics = (evaluated_final_model(trainer.state, trainer.args) if reuse else None) or trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    if "test" in splits:
        test_metrics = trainer.evaluate(splits["test"], metric_key_prefix="test")
        trainer.log_metrics("test", test_metrics)
        trainer.save_metrics("test", test_metrics)
        metrics = {**metrics, **test_metrics}
    return metrics


__all__ = [
    "FineTuneTrainer",
    "build_trainer",
    "evaluate_final_model",
    "evaluated_final_model",
]
