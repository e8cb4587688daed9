"""Fine-tuning on the transformers Trainer: the stages a fine-tune runs (`run_finetune`), one function each.

The output folder between runs (complete checkpoints, resume, the finished-run guard) is `checkpoints`; the
command line that starts a fine-tune is read by `argv`, the command itself is `vit_ft.commands.finetune`.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import datasets
from transformers import TrainingArguments, ViTImageProcessorPil, set_seed
from transformers.image_utils import PILImageResampling

from ..arguments.checks import check_naflex
from ..arguments.family_defaults import describe_family_defaults
from ..arguments.fields import DataArguments, ModelArguments
from ..arguments.plan import run_compute
from ..arguments.training_arguments import data_seed, describe_batch
from ..data.bad_images import decode_error, prescan_small_splits
from ..data.builtin import write_builtin_dataset
from ..data.datasets import load_image_datasets, problem_type_of
from ..data.digits import write_digits_imagefolder
from ..data.exclusions import apply_exclusions, read_exclusions
from ..data.streaming import TrainStream, load_streamed_datasets, streamed_max_steps
from ..data.transforms import INDEX_COLUMN, ImageClassificationTransform, build_transforms
from ..kernels import kernelize
from ..model.formats import checkpoint_normalization
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..tasks import Task, task_for
from ..utils.files import is_disk_full
from ..utils.lock import output_lock_in_process_zero
from ..utils.run_record import mark_unfinished, read_run_record
from .callbacks import BadImageCallback, StepsFromArguments, use_readable_console
from .checkpoints import (
    CheckpointRecordCallback,
    check_run_output_dir,
    claim_output_dir,
    finished_run_message,
    resolve_resume,
    run_inputs,
)
from .faults import check_base_checkpoint, disk_full_error, refuse_pickled_code
from .outputs import save_outputs
from .preemption import PreemptionCallback
from .probes import PROBE_METHODS, fit_probe
from .resume import check_resume, run_settings
from .trainer import build_trainer, evaluate_final_model
from .workers import check_data_loading

logger = logging.getLogger("vit_ft")


def prepare_builtin_data(data_args: DataArguments, training_args: TrainingArguments) -> None:
    """Write the built-in dataset's image folders when they are missing (main process first)."""
    if data_args.builtin_dataset is not None:
        with training_args.main_process_first(
            desc=f"writing the built-in {data_args.builtin_dataset} images"
        ):
            write_builtin_dataset(data_args.builtin_dataset, data_args.train_dir)


def prepare_builtin_checkpoint(
    model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments
) -> None:
    """Pre-train the built-in checkpoint when it is missing (main process first), after the data is checked.

    It pre-trains on the built-in digits images; when the command line replaced the recipe's digits data
    with the user's own, those images are written to data/digits for the pre-training alone.
    """
    if model_args.pretrain_if_missing is None:
        return
    with training_args.main_process_first(desc="pre-training the built-in checkpoint"):
        missing = not Path(model_args.model_name_or_path).exists()
        if missing and training_args.process_index == 0:
            from .pretrain import pretrain_digits

            if data_args.builtin_dataset == "digits":
                digits_train = Path(data_args.train_dir)
            else:
                digits_train = Path("data/digits/train")
                write_digits_imagefolder(digits_train.parent, seed=0)
            logger.info(
                "No checkpoint at %s: pre-training the small digits ViT at 16x16 first.",
                model_args.model_name_or_path,
            )
            size = model_args.pretrain_if_missing  # digits, or digits-small (the distillation student)
            pretrain_digits(
                model_args.model_name_or_path,
                digits_train,
                seed=training_args.seed,
                progress=not training_args.disable_tqdm,
                size=size,
            )


def load_data(
    data_args: DataArguments, training_args: TrainingArguments
) -> tuple[datasets.DatasetDict | dict[str, Any], list[str]]:
    """The train / validation (/ test) splits, the bad images of the small ones dropped (`check_images`; larger
    splits' are skipped where decoded), and the class names; with `streaming`, train is a `TrainStream` (never
    scanned before training: its bad images are skipped where decoded)."""
    if data_args.streaming:
        return load_streamed_data(data_args, training_args)
    with training_args.main_process_first(desc="loading the images"):
        splits, names = load_image_datasets(
            dataset_name=data_args.dataset_name,
            dataset_config=data_args.dataset_config,
            train_dir=data_args.train_dir,
            validation_dir=data_args.validation_dir,
            test_dir=data_args.test_dir,
            train_split=data_args.train_split,
            validation_split=data_args.validation_split,
            test_split=data_args.test_split,
            image_column=data_args.image_column,
            label_column=data_args.label_column,
            validation_split_percentage=data_args.validation_split_percentage,
            seed=data_seed(training_args),
            max_train_samples=data_args.max_train_samples,
            max_eval_samples=data_args.max_eval_samples,
            problem_type=data_args.problem_type,
            label_names=data_args.class_names,
            label_separator=data_args.label_separator,
        )
    if data_args.exclude:  # an audit's findings: dropped or relabelled, recorded in the run record's "data"
        plan = read_exclusions(data_args.exclude)
        subsampled = data_args.max_train_samples is not None or data_args.max_eval_samples is not None
        applied, data_args.exclude_applied = apply_exclusions(dict(splits), names, plan, subsampled)
        splits = datasets.DatasetDict(applied)
        logger.info("exclude: %s: %d training images dropped, %d relabelled.", plan.file,
                    data_args.exclude_applied["dropped"], data_args.exclude_applied["relabelled"])  # fmt: skip
    if data_args.check_images:  # outside the barrier: each process scans its own small splits, none waits
        splits = datasets.DatasetDict(prescan_small_splits(splits, "image", logger))
    _check_two_classes(names, data_args)
    logger.info("Data: %s; %d classes.", {k: len(v) for k, v in splits.items()}, len(names))
    return splits, names


def _check_two_classes(names: list[str], data_args: DataArguments) -> None:
    if len(names) < 2:
        source = data_args.train_dir or f"dataset {data_args.dataset_name!r}"
        raise ValueError(
            f"the training data in {source} has {len(names)} class ({names}); a classifier needs at least two. "
            "Add images of the other classes."
        )


# what a stream cannot give before training: every label of the split, or a row count to cut it at
_STREAM_REFUSED = {
    "max_train_samples": "a stream trains for max_steps: lower max_steps instead",
    "class_weights": "a class's weight needs its count over the whole training split",
    "balanced_sampler": "it draws by index from the whole split",
    "pos_weight": "it is counted over the whole training split",
    "exclude": "a stream is not read whole before training, so the images it names cannot be found",
}


def load_streamed_data(
    data_args: DataArguments, training_args: TrainingArguments
) -> tuple[dict[str, Any], list[str]]:
    """`load_data` for `streaming: true`: the training split streamed, split across the processes, with the
    schedule in steps (max_steps, or derived from the size the metadata states); evaluation splits read once."""
    if not data_args.dataset_name:
        raise ValueError(
            "streaming reads dataset_name (a Hub dataset id or a folder of webdataset .tar shards); image folders "
            "(train_dir) are read whole: drop streaming, or pass the folder as dataset_name."
        )
    for key, why in _STREAM_REFUSED.items():
        value = getattr(data_args, key, None) if hasattr(data_args, key) else getattr(training_args, key, None)
        if value not in (None, False):
            raise ValueError(f"{key}={value!r} does not go with streaming: {why}; or drop streaming.")
    seed = data_seed(training_args)
    with training_args.main_process_first(desc="reading the evaluation splits of the stream"):
        splits, names = load_streamed_datasets(
            dataset_name=data_args.dataset_name,
            dataset_config=data_args.dataset_config,
            train_split=data_args.train_split,
            validation_split=data_args.validation_split,
            test_split=data_args.test_split,
            image_column=data_args.image_column,
            label_column=data_args.label_column,
            validation_split_percentage=data_args.validation_split_percentage,
            seed=seed,
            max_eval_samples=data_args.max_eval_samples,
            cache_dir=getattr(data_args, "cache_dir", None),
            problem_type=data_args.problem_type,
            label_names=data_args.class_names,
        )
    _check_two_classes(names, data_args)
    stream: TrainStream = splits["train"]
    stream.rank, stream.world_size = training_args.process_index, training_args.world_size
    stream.batch_size = training_args.per_device_train_batch_size
    global_batch = stream.batch_size * training_args.gradient_accumulation_steps * training_args.world_size
    if training_args.max_steps <= 0:
        training_args.max_steps = streamed_max_steps(stream, training_args.num_train_epochs, global_batch)
        logger.info("Streaming: max_steps=%d (%s epochs of the stated size).",
                    training_args.max_steps, training_args.num_train_epochs)  # fmt: skip
    logger.info(
        "Data: train streamed (%s examples stated, %d shards), %s; %d classes.",
        stream.num_examples, stream.n_shards, {k: len(v) for k, v in splits.items() if k != "train"}, len(names),
    )  # fmt: skip
    return splits, names


def build_model(
    model_args: ModelArguments, names: list[str], task: Task | None = None
) -> tuple[Any, ViTImageProcessorPil]:
    """The model to fine-tune: the pre-trained ViT at the fine-tuning resolution with a new head for `task`
    (default single-label; its `problem_type` saved in the config: the model's loss, and transformers' pipeline,
    follow it), and its image processor. (A trained model is loaded for inference by `tools.trained.load_model`.)"""
    task = task or task_for()
    check_base_checkpoint(model_args.model_name_or_path)  # cut short, or pickled code: one line, nothing run
    id2label = dict(enumerate(names))
    model = ViTFTForImageClassification.from_pretrained(
        model_args.model_name_or_path,
        id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
        image_size=model_args.image_size,
        problem_type=task.problem_type,
        # NaFlex asked for (`vit_ft.data.naflex`); unset keeps the checkpoint's own (SigLIP 2's num_patches)
        **({} if model_args.max_num_patches is None else {"max_num_patches": model_args.max_num_patches}),
        **({} if model_args.pooling is None else {"pooling": model_args.pooling}),
        **({} if getattr(model_args, "fc_norm", None) is None else {"fc_norm": model_args.fc_norm}),
        hidden_dropout_prob=model_args.hidden_dropout_prob,
        attention_probs_dropout_prob=model_args.attention_probs_dropout_prob,
        # None keeps the checkpoint's own rate (a timm checkpoint's, where its config records one)
        **({} if model_args.drop_path_rate is None else {"drop_path_rate": model_args.drop_path_rate}),
        cache_dir=model_args.cache_dir,
    )
    kernelize(model)  # the CPU kernels where the switch allows them, before LoRA wraps the layers
    # a head, a pooling head asked for, or the norm after the pooling (MAE's fc_norm: new, as MAE's fine-tuning)
    new_heads = ("classifier.", "distillation_classifier.", "attn_pool.", "fc_norm.")
    missing = [key for key in model.loading_report.newly_initialized if not key.startswith(new_heads)]
    if missing:
        raise ValueError(
            f"{model_args.model_name_or_path} lacks encoder weights {missing[:5]}{' ...' if len(missing) > 5 else ''}: "
            "fine-tuning starts from a complete pre-trained ViT; check that model_name_or_path is a ViTModel / "
            "ViTForImageClassification checkpoint of the same size."
        )
    # transformers' image processor, timm's pretrained_cfg or the paper's [-1, 1] for a JAX .npz
    settings = checkpoint_normalization(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    if not settings:
        logger.warning(
            "No image processor in %s; using ViT's default normalisation (mean 0.5, std 0.5).",
            model_args.model_name_or_path,
        )
    height, width = model.config.image_hw
    # bicubic, as the training transforms resample, so that inference through the processor sees the same pixels
    processor = ViTImageProcessorPil(
        **settings, size={"height": height, "width": width}, resample=PILImageResampling.BICUBIC
    )
    if model_args.use_lora:
        from .lora import apply_lora

        model = apply_lora(model, model_args)
    return model, processor


def _augmentation_kwargs(data_args: DataArguments) -> dict[str, Any]:
    """build_transforms' `augmentation` argument when the recipe turns any per-image augmentation on."""
    spec = data_args.augmentation_spec()
    return {} if spec is None else {"augmentation": spec}


def build_mixup(data_args: DataArguments, training_args: TrainingArguments, num_classes: int) -> Any | None:
    """The training batches' mixup / cutmix collator (soft targets, label smoothing folded in), or None when off."""
    if not data_args.mixes_batches:
        return None
    from ..data.mixup import MixupCutmix

    return MixupCutmix(
        num_classes=num_classes,
        mixup_alpha=data_args.mixup_alpha,
        cutmix_alpha=data_args.cutmix_alpha,
        prob=data_args.mixup_prob,
        switch_prob=data_args.mixup_switch_prob,
        label_smoothing=training_args.label_smoothing_factor,
        seed=data_seed(training_args),
    )


AUGMENTATIONS_FIGURE = "augmentations.png"


def write_augmentations(
    splits: datasets.DatasetDict,
    transform: ImageClassificationTransform,
    mixup: Any | None,
    training_args: TrainingArguments,
) -> None:
    """`augmentations.png` in the output folder (process 0): a few training images, each in several augmented
    draws as the model sees them (and one mixed batch of them with mixup / cutmix)."""
    if training_args.process_index != 0:
        return
    from ..reports.augmentation_figure import write_augmentation_figure

    if isinstance(splits["train"], TrainStream):
        images = [row["image"] for row in splits["train"].head(16)]
    else:
        train = splits["train"].with_format(None)  # the undecoded images, without the transform
        images = train.select(range(min(16, len(train))))["image"]
    # four that decode: large and streamed splits are not scanned before training (data.bad_images)
    images = [image for image in images if not decode_error(image)][:4]
    if not images:
        return
    path = Path(training_args.output_dir) / AUGMENTATIONS_FIGURE
    write_augmentation_figure(images, transform, path, mixer=mixup, seed=training_args.seed)


def attach_transforms(
    splits: datasets.DatasetDict, processor: ViTImageProcessorPil, data_args: DataArguments, seed: int,
    naflex: dict[str, Any] | None = None,
) -> ImageClassificationTransform:  # fmt: skip
    """Random-resized-crop + flip (+ the recipe's RandAugment, colour jitter, random erasing) for training,
    resize + center crop for evaluation, normalised by the processor.

    The train split gains `INDEX_COLUMN` (its row positions) and its augmentation becomes a function of (seed,
    epoch, index); returns the train transform, whose epoch `AugmentationEpochCallback` sets. It returns uint8
    crops: the rest runs per batch on the training device (`build_trainer`'s `BatchAugmentation`). With `naflex`
    (`max_num_patches`, `patch_size`: the model's), NaFlex patches instead, everything in the workers.
    """
    naflex = naflex if naflex and naflex.get("max_num_patches") is not None else {}
    size = (processor.size["height"], processor.size["width"])
    common = {
        "mean": processor.image_mean,
        "std": processor.image_std,
        "rescale_factor": processor.rescale_factor,
        **naflex,
    }
    train_transform = build_transforms(
        size,
        train=True,
        crop_scale=(data_args.crop_scale_min, 1.0),
        horizontal_flip=data_args.horizontal_flip,
        seed=seed,
        **_augmentation_kwargs(data_args),
        # uint8 crops, the rest per batch on the device (BatchAugmentation); NaFlex grids differ: in the workers
        device_augmentation=not naflex,
        **common,
    )
    eval_transform = build_transforms(size, train=False, **common)
    for name in splits:
        if isinstance(splits[name], TrainStream):  # undecoded already; its index comes from its position
            splits[name].transform = train_transform
            continue
        # undecoded {"bytes", "path"} images: the transform decodes them itself, at reduced size where it can
        splits[name] = splits[name].cast_column("image", datasets.Image(decode=False))
        if name == "train":
            # global row positions, the same in every process (each process loads the whole split)
            splits[name] = splits[name].add_column(INDEX_COLUMN, list(range(len(splits[name]))))
        splits[name].set_transform(train_transform if name == "train" else eval_transform)
    return train_transform


def run_finetune(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
    recipe: str | None = None,
    overwrite_output_dir: bool = False,
) -> dict[str, float]:
    """Fine-tune as the recipe says and write the output folder; returns the final metrics.

    Refused before any work: an output_dir that is or lies inside an input (the starting checkpoint, an image
    folder), and a folder holding a finished run unless `overwrite_output_dir` is set; resuming a finished run
    logs that there is nothing to resume, changes nothing and returns the metrics its run record holds. A resume
    that changes what the weights depend on is refused before any step (`resume.check_resume`).
    The folder is locked for the run (`utils.lock`: a second run into it is refused, naming this one); the run
    record written last (`"finished": true`) marks it finished. A full disk while saving is one line (OSError)
    naming the last complete checkpoint; a preemption signal saves a checkpoint and raises Preempted.
    """
    if model_args.method == "auto":  # the ladder: one run_finetune per rung, into OUTPUT/ladder/<rung>/
        from .ladder import run_ladder

        prepare_builtin_data(data_args, training_args)  # once, before the ladder's clock starts
        prepare_builtin_checkpoint(model_args, data_args, training_args)
        return run_ladder(model_args, data_args, training_args, recipe, overwrite_output_dir, run_finetune=run_finetune)
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
            return _finetune(model_args, data_args, training_args, recipe)
        except Exception as error:
            if is_disk_full(error, training_args.output_dir):
                raise disk_full_error(error, training_args.output_dir) from error
            raise


def _finetune(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
    recipe: str | None,
) -> dict[str, float]:
    """`run_finetune`'s stages, in the locked output folder."""
    # first: the family defaults taken over the recipe's values, and the global batch: the run's protocol (the
    # run record's `family_defaults` and `batch` state them too)
    for line in describe_family_defaults(getattr(training_args, "family_defaults", None)):
        logger.info(line)
    logger.info(describe_batch(training_args))
    run_compute(training_args).log()  # device, precision, kernels: a warning where bf16 runs emulated
    set_seed(training_args.seed)
    resume = resolve_resume(training_args)
    if resume is not None:
        refuse_pickled_code(resume)

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
    model, processor = build_model(model_args, names, task)
    check_naflex(model.config.max_num_patches, data_args)  # a checkpoint's own NaFlex, too
    naflex = {"max_num_patches": model.config.max_num_patches, "patch_size": model.config.patch_hw[0]}
    train_transform = attach_transforms(splits, processor, data_args, training_args.seed, naflex)
    mixup = build_mixup(data_args, training_args, len(names))
    if resume is None and training_args.process_index == 0:  # before its first file: the names are the run's
        claim_output_dir(training_args.output_dir)
    write_augmentations(splits, train_transform.on_workers(), mixup, training_args)
    check_data_loading(training_args, splits["train"])  # the workers' shared memory; one log line
    # training images that do not decode: skipped by the collator, counted, named in the record
    if isinstance(splits["train"], TrainStream):
        # counted against the images the run reads at most: the split's stated size, or the reads of max_steps
        # (a bad image counts once however many passes read it: `streaming.bad_image_row`)
        reads = training_args.max_steps * training_args.gradient_accumulation_steps * training_args.world_size
        reads *= training_args.per_device_train_batch_size
        stated = splits["train"].num_examples
        bad_images = BadImageCallback(min(reads, stated or reads), data_args.max_bad_image_fraction)
    else:
        bad_images = BadImageCallback.for_dataset(splits["train"], data_args.max_bad_image_fraction)
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
    trainer.add_callback(bad_images)
    trainer.bad_images = bad_images  # the batches' names of the images they dropped reach the callback
    preemption = PreemptionCallback()
    if isinstance(splits["train"], TrainStream):
        # the stream skips the trained batches itself, before decoding them (`TrainStream.resume_from_batch`)
        trainer.args.ignore_data_skip = True
        splits["train"].resume_from_batch = _trained_batches(resume, training_args)
    trainer.add_callback(preemption)
    trainer.add_callback(CheckpointRecordCallback(uuid.uuid4().hex, settings))
    trainer.add_callback(StepsFromArguments())
    use_readable_console(trainer)  # one line per evaluation, not Trainer's log dicts

    # train; a finished run being replaced or continued no longer counts as finished until the end
    if training_args.process_index == 0:
        mark_unfinished(training_args.output_dir)
    try:
        if model_args.method in PROBE_METHODS:  # a probe on the frozen backbone, fitted instead of trained
            result = fit_probe(trainer, model_args.method, training_args.seed)
        else:
            result = trainer.train(resume_from_checkpoint=resume)
    finally:
        preemption.restore()
    preemption.check(training_args.output_dir)  # stopped on SIGTERM / SIGUSR1: saved, not finished
    train_metrics = {**result.metrics, **evaluation_time.training_speed(result.metrics)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()

    # what the task chooses on validation before the final evaluation (a multi-label decision threshold); save
    during_training = trainer.compute_metrics
    fitted = task.finish(trainer)
    reuse = trainer.compute_metrics is during_training  # else the metrics changed with what was fitted
    metrics = {**train_metrics, **evaluate_final_model(trainer, splits, reuse=reuse)}
    save_outputs(trainer, model_args, data_args, training_args, names, metrics, recipe, task, fitted, splits)
    return metrics


def _trained_batches(resume: str | None, training_args: TrainingArguments) -> int:
    """The batches each process trained on before the checkpoint `resume` (0 for a fresh run)."""
    if resume is None:
        return 0
    state = json.loads((Path(resume) / "trainer_state.json").read_text())
    return int(state["global_step"]) * training_args.gradient_accumulation_steps


__all__ = [
    "AUGMENTATIONS_FIGURE",
    "attach_transforms",
    "build_mixup",
    "build_model",
    "load_data",
    "load_streamed_data",
    "prepare_builtin_checkpoint",
    "prepare_builtin_data",
    "run_finetune",
    "write_augmentations",
]
