"""Fine-tuning on the transformers Trainer: the stages `scripts/finetune.py` runs, one function each."""

from __future__ import annotations

import copy
import json
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import datasets
import transformers
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
    ViTImageProcessorPil,
    set_seed,
)
from transformers.image_utils import PILImageResampling

from ..data.bad_images import drop_bad_images
from ..data.datasets import load_image_datasets
from ..data.digits import write_digits_imagefolder
from ..data.transforms import INDEX_COLUMN, ImageClassificationTransform, build_transforms, collate_fn
from ..metrics import build_compute_metrics
from ..model.checkpoint_formats import checkpoint_normalization
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.run_record import EXAMPLES_DIR, LABELS_FILE, is_finished, mark_unfinished, write_run_record
from .arguments import DataArguments, ModelArguments

logger = logging.getLogger("vit_ft")


def setup_logging(training_args: TrainingArguments) -> None:
    """Our messages at INFO on the main process, WARNING elsewhere; the libraries at `--log_level`."""
    level = training_args.get_process_log_level()
    ours = logging.INFO if training_args.should_log else logging.WARNING
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    for name in ("vit_ft", "__main__"):
        logging.getLogger(name).setLevel(ours)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def prepare_builtin_data(data_args: DataArguments, training_args: TrainingArguments) -> None:
    """Write the built-in dataset's image folders when they are missing (main process first)."""
    if data_args.builtin_dataset == "digits":
        with training_args.main_process_first(desc="writing the built-in digits images"):
            write_digits_imagefolder(Path(data_args.train_dir).parent, seed=0)


def prepare_builtin_checkpoint(
    model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments
) -> None:
    """Pre-train the built-in checkpoint when it is missing (main process first), after the data is checked.

    It pre-trains on the built-in digits images; when the command line replaced the recipe's digits data
    with the user's own, those images are written to data/digits for the pre-training alone.
    """
    if model_args.pretrain_if_missing != "digits":
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
            pretrain_digits(model_args.model_name_or_path, digits_train, seed=training_args.seed)


def load_data(
    data_args: DataArguments, training_args: TrainingArguments
) -> tuple[datasets.DatasetDict, list[str]]:
    """The train / validation (/ test) splits with bad images dropped, and the class names."""
    with training_args.main_process_first(desc="loading and checking the images"):
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
            seed=training_args.data_seed if training_args.data_seed is not None else training_args.seed,
            max_train_samples=data_args.max_train_samples,
            max_eval_samples=data_args.max_eval_samples,
        )
        if data_args.check_images:
            for split in list(splits):
                splits[split] = drop_bad_images(splits[split], "image", logger)
    if len(names) < 2:
        source = data_args.train_dir or f"dataset {data_args.dataset_name!r}"
        raise ValueError(
            f"the training data in {source} has {len(names)} class ({names}); a classifier needs at least two. "
            "Add images of the other classes."
        )
    logger.info("Data: %s; %d classes.", {k: len(v) for k, v in splits.items()}, len(names))
    return splits, names


def load_model(model_args: ModelArguments, names: list[str]) -> tuple[Any, ViTImageProcessorPil]:
    """The pre-trained ViT at the fine-tuning resolution with a new head, and its image processor."""
    id2label = dict(enumerate(names))
    model = ViTFTForImageClassification.from_pretrained(
        model_args.model_name_or_path,
        id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
        image_size=model_args.image_size,
        pooling=model_args.pooling,
        hidden_dropout_prob=model_args.hidden_dropout_prob,
        attention_probs_dropout_prob=model_args.attention_probs_dropout_prob,
        cache_dir=model_args.cache_dir,
    )
    missing = [key for key in model.loading_report.newly_initialized if not key.startswith("classifier.")]
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


def attach_transforms(
    splits: datasets.DatasetDict, processor: ViTImageProcessorPil, data_args: DataArguments, seed: int
) -> ImageClassificationTransform:
    """Random-resized-crop + flip for training, resize + center crop for evaluation, normalised by the processor.

    The train split gains `INDEX_COLUMN` (its row positions) and its augmentation becomes a function of (seed,
    epoch, index); returns the train transform, whose epoch `AugmentationEpochCallback` sets.
    """
    size = (processor.size["height"], processor.size["width"])
    common = {
        "mean": processor.image_mean,
        "std": processor.image_std,
        "rescale_factor": processor.rescale_factor,
    }
    train_transform = build_transforms(
        size,
        train=True,
        crop_scale=(data_args.crop_scale_min, 1.0),
        horizontal_flip=data_args.horizontal_flip,
        seed=seed,
        **common,
    )
    eval_transform = build_transforms(size, train=False, **common)
    for name in splits:
        # undecoded {"bytes", "path"} images: the transform decodes them itself, at reduced size where it can
        splits[name] = splits[name].cast_column("image", datasets.Image(decode=False))
        if name == "train":
            # global row positions, the same in every process (each process loads the whole split)
            splits[name] = splits[name].add_column(INDEX_COLUMN, list(range(len(splits[name]))))
        splits[name].set_transform(train_transform if name == "train" else eval_transform)
    return train_transform


class AugmentationEpochCallback(TrainerCallback):
    """Sets the train transform's epoch at each epoch's start, so that its augmentation replays on resume.

    The Trainer calls on_epoch_begin before it creates the epoch's DataLoader iterator (and the workers), and a
    run resumed mid-epoch starts at the checkpoint's epoch: that is the floor of state.epoch then, one more at
    each later epoch. Dropout needs nothing here: the Trainer restores the global RNG saved with the checkpoint.
    """

    def __init__(self, transform: ImageClassificationTransform) -> None:
        self.transform = transform
        self.epoch: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.epoch = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        # state.epoch is a whole number at an epoch's start and epoch + fraction in a resumed one
        self.epoch = int(state.epoch) if self.epoch is None else self.epoch + 1
        self.transform.set_epoch(self.epoch)


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


def evaluated_final_model(state: Any, args: TrainingArguments) -> dict[str, float] | None:
    """The validation metrics the Trainer logged for the weights the run ends with, if it evaluated them.

    Those weights are the best checkpoint's when load_best_model_at_end loaded it, else the last step's.
    None when that step was never evaluated (then evaluate once more).
    """
    step = state.global_step
    if args.load_best_model_at_end and state.best_model_checkpoint:
        step = int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1])
    for entry in reversed(state.log_history):
        if entry.get("step") == step and "eval_loss" in entry:
            return {key: value for key, value in entry.items() if key.startswith("eval_")} | {
                "epoch": state.epoch
            }
    return None


_WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from, or None when it can.

    Complete means: trainer_state.json (which Trainer writes last) parses and names the folder's step, and
    the weights file is there and its safetensors header covers the whole file (a cut-short file fails that).
    """
    path = Path(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return "no readable trainer_state.json (the run died while saving it)"
    step = path.name.rsplit("-", 1)[-1]
    if not step.isdigit() or state.get("global_step") != int(step):
        return f"its trainer_state.json is for step {state.get('global_step')}, not {step}"
    weights = [path / name for name in _WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        return "no model.safetensors"
    from safetensors import safe_open

    try:
        with safe_open(str(weights[0]), framework="pt"):
            pass
    except Exception as error:  # safetensors raises its own error type for a truncated or corrupt file
        return f"its weights {weights[0].name} cannot be loaded ({error})"
    return None


def checkpoint_is_complete(path: str | Path) -> bool:
    """Whether `path` is a checkpoint Trainer can resume from (see `checkpoint_problem`)."""
    return checkpoint_problem(path) is None


def _checkpoints_newest_first(output_dir: Path) -> list[Path]:
    found = [p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]), reverse=True)


def newest_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint-* in `output_dir`, moving nothing (None when there is none)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    return next((str(p) for p in _checkpoints_newest_first(output_dir) if checkpoint_is_complete(p)), None)


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint-* in `output_dir`; incomplete ones (the process died while writing them,
    or their weights do not load) are moved aside to `incomplete-checkpoint-*`, so that Trainer never resumes
    from or rotates onto them, and the newest good one is used instead."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    for path in _checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        aside = path.with_name(f"incomplete-{path.name}")
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        logger.warning("%s cannot be resumed from: %s; moved to %s and skipped.", path, problem, aside.name)
    return None


def check_output_dir(training_args: TrainingArguments, overwrite_output_dir: bool = False) -> None:
    """Refuse an output_dir that is a file, or that holds a finished run, unless told to overwrite or resume."""
    output_dir = Path(training_args.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(
            f"output_dir={str(output_dir)!r} is a file, not a folder; pass another --output_dir."
        )
    resume = training_args.resume_from_checkpoint not in (None, False, "false", "False")
    if is_finished(output_dir) and not (overwrite_output_dir or resume):
        raise FileExistsError(
            f"{output_dir} holds a finished run, whose model this run would replace; pass --overwrite_output_dir "
            "to replace it, --resume to continue it, or another --output_dir."
        )


def interrupted_message(output_dir: str | Path) -> str:
    """The one line to print on Ctrl-C: where the last complete checkpoint is, and how to go on (cli.run_tool
    closes the progress bars first)."""
    last = newest_complete_checkpoint(output_dir)
    if last is None:
        return f"interrupted before any checkpoint was saved in {output_dir}. Run the same command again to start over."
    return f"interrupted; the last complete checkpoint is {last}. Run the same command with --resume to continue."


# Errors a user causes (bad paths, folders, values, an offline Hub): one line, no traceback (scripts/finetune.py)
def resolve_resume(training_args: TrainingArguments) -> str | None:
    """The checkpoint to resume from: an explicit path, or the last complete one in output_dir for `--resume`."""
    resume = training_args.resume_from_checkpoint
    if resume in (None, False, "false", "False"):
        return None
    if resume in (True, "true", "True", "last"):
        last = (
            last_complete_checkpoint(training_args.output_dir) if training_args.process_index == 0 else None
        )
        if training_args.world_size > 1:
            last = broadcast_object(last)
        if last is None:
            raise FileNotFoundError(
                f"--resume: no complete checkpoint-* folder in {training_args.output_dir}; start without --resume, "
                "or point --output_dir at the interrupted run."
            )
        return last
    if not checkpoint_is_complete(resume):
        raise FileNotFoundError(
            f"resume_from_checkpoint={resume!r} is not a complete Trainer checkpoint folder."
        )
    return resume


def end_process_group() -> None:
    """Destroy the several-process group, if any, before the process exits: a gloo group left to interpreter
    shutdown can abort the process ("terminate called without an active exception") after a complete run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(value: Any) -> Any:
    """`value` from process 0 on every process (several-process runs)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run_finetune(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
    recipe: str | None = None,
    overwrite_output_dir: bool = False,
) -> dict[str, float]:
    """Fine-tune as the recipe says and write the output folder; returns the final metrics.

    A folder holding a finished run is refused unless `overwrite_output_dir` or resume_from_checkpoint is set;
    the run record written last (`"finished": true`) marks the folder finished.
    """
    check_output_dir(training_args, overwrite_output_dir)
    setup_logging(training_args)
    set_seed(training_args.seed)
    resume = resolve_resume(training_args)

    # data and checkpoint
    prepare_builtin_data(data_args, training_args)
    splits, names = load_data(data_args, training_args)  # folders checked before any pre-training
    prepare_builtin_checkpoint(model_args, data_args, training_args)
    model, processor = load_model(model_args, names)
    train_transform = attach_transforms(splits, processor, data_args, training_args.seed)

    # trainer; the finished folder is pushed once, with our card (scripts/finetune.py), not at every save
    trainer_args = copy.copy(training_args)
    trainer_args.push_to_hub = False
    trainer = Trainer(
        model=model,
        args=trainer_args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        data_collator=collate_fn,
        compute_metrics=build_compute_metrics(),
        processing_class=processor,
        callbacks=[AugmentationEpochCallback(train_transform), evaluation_time := EvaluationTime()],
    )

    # train; a finished run being replaced or continued no longer counts as finished until the end
    if training_args.process_index == 0:
        mark_unfinished(training_args.output_dir)
    result = trainer.train(resume_from_checkpoint=resume)
    train_metrics = {**result.metrics, **evaluation_time.training_speed(result.metrics)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()

    # evaluate (the best model is loaded at the end when load_best_model_at_end); a validation pass already made
    # on the final weights during training is reused, not repeated
    metrics = dict(train_metrics)
    eval_metrics = evaluated_final_model(trainer.state, trainer.args) or trainer.evaluate()
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    metrics.update(eval_metrics)
    if "test" in splits:
        test_metrics = trainer.evaluate(splits["test"], metric_key_prefix="test")
        trainer.log_metrics("test", test_metrics)
        trainer.save_metrics("test", test_metrics)
        metrics.update(test_metrics)

    # save
    save_outputs(trainer, model_args, data_args, training_args, names, metrics, recipe)
    return metrics


def save_outputs(
    trainer: Trainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
    names: list[str],
    metrics: dict[str, float],
    recipe: str | None,
) -> None:
    """Model (vit_ft format), processor, label maps, example images, run info, model card and training curves."""
    from ..reports.reporting import plot_training_curves, write_model_card
    from .lora import save_lora_outputs

    output_dir = Path(training_args.output_dir)
    if model_args.use_lora:
        save_lora_outputs(trainer, model_args, output_dir)
    else:
        trainer.save_model(str(output_dir))
    if not trainer.is_world_process_zero():
        return
    id2label = dict(enumerate(names))
    (output_dir / LABELS_FILE).write_text(
        json.dumps({"id2label": id2label, "label2id": {n: i for i, n in id2label.items()}}, indent=2)
    )
    write_examples(trainer.eval_dataset, names, output_dir)
    run_info = {
        "recipe": recipe,
        "base_model": model_args.model_name_or_path,
        "image_size": [trainer.processing_class.size["height"], trainer.processing_class.size["width"]],
        "lora": model_args.use_lora,
        "data": {k: v for k, v in vars(data_args).items()},
        "seed": training_args.seed,
        "data_seed": training_args.data_seed,
        "world_size": training_args.world_size,
        "written_by_process": training_args.process_index,
        "metrics": metrics,
    }
    write_run_record(output_dir, {**run_info, "finished": False})  # the card links to it
    plot_training_curves(trainer.state.log_history, output_dir / "training_curves.png")
    write_model_card(output_dir, run_info)
    # last: the record is the completion marker (run_record.is_finished), after the model, processor and labels
    write_run_record(output_dir, {**run_info, "finished": True})
    logger.info(
        "Results in %s: %s",
        output_dir,
        {k: round(v, 4) for k, v in metrics.items() if k.endswith("accuracy")},
    )


MAX_EXAMPLES = 8  # images in examples/: enough to try the demo, little to upload


def write_examples(
    dataset: datasets.Dataset, names: list[str], output_dir: Path, limit: int = MAX_EXAMPLES
) -> list[Path]:
    """A few images of `dataset` (the validation split) in `output_dir/examples/`, for the demo and the Hub.

    At most `limit` in all and `limit // classes` per class (at least one), taken in the split's order, which
    the data seed fixes: the same run writes the same files. Named `NN_<label>`: PNG up to 256 pixels a side,
    JPEG above (reduced to 512); an image that does not decode is skipped. The folder is written aside and
    renamed, replacing an older one.
    """
    from ..data.images import load_image

    rows = dataset.with_format(None)  # the stored images, not the eval transform's tensors
    per_class = max(1, limit // max(1, len(names)))
    chosen: list[int] = []
    counts = [0] * len(names)
    for row, label in enumerate(rows["label"]):
        if counts[label] < per_class:
            counts[label] += 1
            chosen.append(row)
            if len(chosen) == limit:
                break
    folder = output_dir / EXAMPLES_DIR
    partial = output_dir / f".{EXAMPLES_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    written = []
    for row in chosen:
        try:
            image = load_image(rows[row]["image"])
        except Exception as error:  # noqa: BLE001 - an example is optional: one that fails is left out
            logger.warning("Example image %d not written: %s", row, error)
            continue
        label = re.sub(r"[^\w.-]+", "_", names[rows[row]["label"]])
        stem = f"{len(written):02d}_{label}"
        if max(image.size) <= 256:
            image.save(partial / f"{stem}.png")
            written.append(f"{stem}.png")
        else:
            image.thumbnail((512, 512))
            image.save(partial / f"{stem}.jpg", quality=90)
            written.append(f"{stem}.jpg")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return [folder / name for name in written]


__all__ = [
    "check_output_dir",
    "end_process_group",
    "checkpoint_is_complete",
    "checkpoint_problem",
    "interrupted_message",
    "last_complete_checkpoint",
    "newest_complete_checkpoint",
    "run_finetune",
    "write_examples",
]
