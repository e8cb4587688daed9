"""Fine-tuning on the transformers Trainer: the stages a fine-tune runs (`run_finetune`), in order.

Each stage is one call into the module that holds it: the built-in data and checkpoint (`builtin`), the splits
(`data`), the model (`model`), what the model sees of each image (`inputs`), the Trainer (`trainer`), training or
a probe's fit (`probes`), the final evaluation and the output folder (`outputs`). The output folder between runs
(complete checkpoints, resume, the finished-run guard) is `checkpoints`; the command itself is
`vit_ft.commands.finetune`.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

from transformers import TrainingArguments, set_seed
from transformers.trainer_utils import TrainOutput

from ..arguments.family_defaults import describe_family_defaults
from ..arguments.fields import DataArguments, ModelArguments
from ..arguments.global_batch import describe_batch
from ..arguments.plan import RunPlan, run_compute
from ..data.datasets import problem_type_of
from ..data.training_split import images_to_count, row_names, skips_trained_batches
from ..tasks import task_for
from ..utils.files import is_disk_full
from ..utils.lock import output_lock_in_process_zero
from ..utils.run_record import mark_unfinished, read_run_record
from .builtin import prepare_builtin_checkpoint, prepare_builtin_data
from .callbacks import BadImageCallback, StepsFromArguments, use_readable_console
from .checkpoints import (
    CheckpointRecordCallback,
    check_run_output_dir,
    claim_output_dir,
    finished_run_message,
    resolve_resume,
    run_inputs,
)
from .data import load_data
from .faults import disk_full_error, refuse_pickled_code
from .inputs import attach_transforms, build_mixup, write_augmentations
from .model import build_model
from .outputs import save_outputs
from .preemption import PreemptionCallback
from .probes import PROBE_METHODS, fit_lp_ft_head, fit_probe
from .resume import check_resume, run_settings
from .trainer import build_trainer, evaluate_final_model
from .workers import check_data_loading

logger = logging.getLogger("vit_ft")


def run_finetune(plan: RunPlan, overwrite_output_dir: bool = False) -> dict[str, float]:
    """Fine-tune as the run `plan` says (`arguments.recipes.build_plan`) and write the output folder; returns the
    final metrics. The stages read the plan; none of them re-parses or re-checks what it decided.

    Refused before any work: an output_dir that is or lies inside an input (the starting checkpoint, an image
    folder), and a folder holding a finished run unless `overwrite_output_dir` is set; resuming a finished run
    logs that there is nothing to resume, changes nothing and returns the metrics its run record holds. A resume
    that changes what the weights depend on is refused before any step (`resume.check_resume`).
    The folder is locked for the run (`utils.lock`: a second run into it is refused, naming this one); the run
    record written last (`"finished": true`) marks it finished. A full disk while saving is one line (OSError)
    naming the last complete checkpoint; a preemption signal saves a checkpoint and raises Preempted.
    """
    model_args, data_args, training_args = plan.arguments
    if model_args.method == "auto":  # the ladder: one run_finetune per rung, into OUTPUT/ladder/<rung>/
        from .ladder import run_ladder

        prepare_builtin_data(data_args, training_args)  # once, before the ladder's clock starts
        prepare_builtin_checkpoint(model_args, data_args, training_args)
        def rung(rung_model: ModelArguments, rung_training: TrainingArguments) -> dict[str, float]:
            return run_finetune(plan.with_arguments(rung_model, rung_training), overwrite_output_dir)

        return run_ladder(model_args, training_args, rung, overwrite_output_dir)
    finished = finished_run_message(training_args)
    if finished is not None:  # before the lock: nothing in the folder changes
        logger.warning(finished)
        return dict((read_run_record(training_args.output_dir) or {}).get("metrics") or {})
    inputs = run_inputs(model_args, data_args, training_args)
    check_run_output_dir(training_args, overwrite_output_dir, inputs)
    index, world_size = training_args.process_index, training_args.world_size
    with output_lock_in_process_zero(training_args.output_dir, "vit-ft finetune", index, world_size):
        check_run_output_dir(
            training_args, overwrite_output_dir, inputs
        )  # again: no other run can change it now
        try:
            return _finetune(plan)
        except Exception as error:
            if is_disk_full(error, training_args.output_dir):
                raise disk_full_error(error, training_args.output_dir) from error
            raise


def _finetune(plan: RunPlan) -> dict[str, float]:
    """`run_finetune`'s stages, in the locked output folder."""
    model_args, data_args, training_args = plan.arguments
    resume = _start(plan)

    # data and checkpoint
    prepare_builtin_data(data_args, training_args)
    splits, names = load_data(data_args, training_args)  # folders checked before any pre-training
    task = task_for(problem_type_of(splits["train"]))  # the data says which: one label per image, or several
    task.check_options(data_args, training_args)  # before the pre-training and the model
    prepare_builtin_checkpoint(model_args, data_args, training_args)
    # what each checkpoint records (once the starting checkpoint exists: its path is recorded resolved)
    settings = run_settings(model_args, data_args, training_args, names, splits)
    if resume is not None:  # what changed since the checkpoint: applied and stated, or refused in one line
        check_resume(resume, training_args, settings)
    loss_weights = task.loss_weights(training_args, splits["train"], names)  # class weights / BCE pos_weight
    # the class ids the balanced sampler draws by, read before the transforms replace the columns
    balanced = task.train_labels(splits["train"]) if training_args.balanced_sampler else None

    # model and inputs
    model, processor = build_model(model_args, names, task)
    train_transform = attach_transforms(splits, processor, data_args, training_args.seed, model.config)
    mixup = build_mixup(data_args, training_args, len(names))
    if resume is None and training_args.process_index == 0:  # before its first file: the names are the run's
        claim_output_dir(training_args.output_dir)
    write_augmentations(splits, train_transform.on_workers(), mixup, training_args)
    check_data_loading(training_args, splits["train"])  # the workers' shared memory; one log line

    # the Trainer
    bad_images = _bad_images(splits["train"], data_args, training_args)
    trainer, evaluation_time = build_trainer(
        model, processor, splits, training_args, data_args, task,
        epoch_targets=[train_transform, *([mixup] if mixup else [])],
        loss_weights=loss_weights,
        train_collator=mixup.collate if mixup else None,
        resume=resume,
        balanced_labels=balanced,
        skip_bad_images=bad_images.collator,
        names=names,
    )  # fmt: skip
    preemption = _add_callbacks(trainer, bad_images, settings, resume, training_args)

    # train (or fit a probe); then what the task chooses on validation (a multi-label decision threshold)
    train_metrics = _train(trainer, model_args, training_args, resume, preemption, evaluation_time)
    during_training = trainer.compute_metrics
    fitted = task.finish(trainer)
    reuse = trainer.compute_metrics is during_training  # else the metrics changed with what was fitted
    metrics = {**train_metrics, **evaluate_final_model(trainer, splits, reuse=reuse)}
    save_outputs(trainer, plan, names, metrics, task, fitted, splits)
    return metrics


def _start(plan: RunPlan) -> str | None:
    """The run's protocol in the log (the family defaults taken over the recipe's values, the global batch, the
    device and precision: the run record states them too), the seed set, and the checkpoint to resume from (its
    pickled code refused), if any."""
    training_args = plan.training_args
    for line in describe_family_defaults(plan.family_defaults):
        logger.info(line)
    logger.info(describe_batch(training_args))
    run_compute(training_args).log()  # device, precision, kernels: a warning where bf16 runs emulated
    set_seed(training_args.seed)
    resume = resolve_resume(training_args)
    if resume is not None:
        refuse_pickled_code(resume)
    return resume


def _bad_images(train: Any, data_args: DataArguments, training_args: TrainingArguments) -> BadImageCallback:
    """Training images that do not decode: skipped by the collator, counted against the images the run meets at
    most (`training_split.images_to_count`: a stream's reads of max_steps at most), named in the record."""
    reads = training_args.max_steps * training_args.gradient_accumulation_steps * training_args.world_size
    reads *= training_args.per_device_train_batch_size
    return BadImageCallback(images_to_count(train, reads), data_args.max_bad_image_fraction, row_names(train))


def _add_callbacks(
    trainer: Any, bad_images: BadImageCallback, settings: dict[str, Any], resume: str | None,
    training_args: TrainingArguments,
) -> PreemptionCallback:  # fmt: skip
    """The bad images' count, the preemption signals, each checkpoint's record, the steps' arguments and the
    console's readable lines; the trained batches a resumed stream skips itself (then not the Trainer)."""
    trainer.add_callback(bad_images)
    trainer.bad_images = bad_images  # the batches' names of the images they dropped reach the callback
    preemption = PreemptionCallback()
    if skips_trained_batches(trainer.train_dataset, _trained_batches(resume, training_args)):
        trainer.args.ignore_data_skip = True
    trainer.add_callback(preemption)
    trainer.add_callback(CheckpointRecordCallback(uuid.uuid4().hex, settings))
    trainer.add_callback(StepsFromArguments())
    if getattr(trainer.model, "peft_config", None):  # a method's own step (AdaLoRA's rank allocation)
        from .lora import peft_callbacks

        for callback in peft_callbacks(trainer.model, training_args, resume):
            trainer.add_callback(callback)
    use_readable_console(trainer)  # one line per evaluation, not Trainer's log dicts
    return preemption


def _train(
    trainer: Any, model_args: ModelArguments, training_args: TrainingArguments, resume: str | None,
    preemption: PreemptionCallback, evaluation_time: Any,
) -> dict[str, float]:  # fmt: skip
    """Train, or fit a probe on the frozen backbone instead; a finished run being replaced or continued no longer
    counts as finished until the end. Stopped by SIGTERM / SIGUSR1: saved, not finished (Preempted)."""
    if training_args.process_index == 0:
        mark_unfinished(training_args.output_dir)
    try:
        if model_args.method in PROBE_METHODS:
            result = fit_probe(trainer, model_args.method, training_args.seed)
        elif model_args.method == "zeroshot":  # the head came from the text tower (build_model): nothing to train
            result = TrainOutput(0, 0.0, {"train_runtime": 0.0, "train_samples": 0})
        else:
            if model_args.method == "lp-ft" and resume is None:  # LP-FT's first stage; a resume has its head
                fit_lp_ft_head(trainer, training_args.seed)
            result = trainer.train(resume_from_checkpoint=resume)
    finally:
        preemption.restore()
    preemption.check(training_args.output_dir)
    train_metrics = {**result.metrics, **evaluation_time.training_speed(result.metrics)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()
    return train_metrics


def _trained_batches(resume: str | None, training_args: TrainingArguments) -> int:
    """The batches each process trained on before the checkpoint `resume` (0 for a fresh run)."""
    if resume is None:
        return 0
    state = json.loads((Path(resume) / "trainer_state.json").read_text())
    return int(state["global_step"]) * training_args.gradient_accumulation_steps


__all__ = ["run_finetune"]
