"""The fine-tune's output folder once training ends: the model (vit_ft format, or the LoRA adapter), label maps,
example images, the feature bank (`tasks.feature_bank`: the out-of-distribution score's), the run record
(written twice: first unfinished, last finished, the completion marker; it names the training images skipped
because they do not decode), the model card and the training curves."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from transformers import Trainer, TrainingArguments

from ..arguments.fields import DataArguments
from ..arguments.global_batch import batch_record
from ..arguments.plan import RunPlan, run_compute
from ..reports.examples import write_examples
from ..utils.distributed import gather_to_zero
from ..utils.files import usual_modes
from ..utils.progress import waiting
from ..utils.run_record import LABELS_FILE, write_run_record
from .callbacks import BadImageCallback
from .inputs import model_input_spec

logger = logging.getLogger("vit_ft")


def save_outputs(
    trainer: Trainer,
    plan: RunPlan,
    names: list[str],
    metrics: dict[str, float],
    task: Any,
    fitted: dict[str, Any] | None = None,
    splits: Any = None,
) -> None:
    """Model (vit_ft format), processor, label maps, example images, run info, model card and training curves.
    `fitted` is what the `task` chose before the final evaluation (a multi-label decision threshold, already in
    the model's config, so saved with it); a single-label task fits its calibration temperature here. Ends by
    printing `run_summary` (the result in words, where everything is, the next commands); `splits` give its
    image counts."""
    from ..tasks.card import write_model_card
    from .lora import save_lora_outputs

    model_args, data_args, training_args = plan.arguments
    output_dir = Path(training_args.output_dir)
    if model_args.peft:
        save_lora_outputs(trainer, model_args, output_dir)
    elif model_args.method == "ssf":  # the scales and shifts folded into the weights: a plain model
        from .ssf import save_ssf_outputs

        save_ssf_outputs(trainer, output_dir)
    else:
        trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        usual_modes(output_dir)  # safetensors writes 0600: the model readable like every other file (checkpoints too)
    shared = _shares_validation_pass(trainer, data_args, task)  # one validation pass for T and the bank's threshold
    # else every process: predict gathers across them; T is fitted on validation, never on test
    calibration = None if shared else task.calibrate(trainer)
    # the bank's forward passes on every process (`_bank_pass`: each its share, or all where the weights are
    # sharded); process zero builds the bank from them
    bank = _feature_bank(trainer, data_args, training_args.seed, shared)
    if not trainer.is_world_process_zero():  # said, so that a quiet process is not taken for a hung one
        waiting(training_args.process_index, "write the output folder (examples, run record, card)")
        return
    id2label = dict(enumerate(names))
    (output_dir / LABELS_FILE).write_text(
        json.dumps({"id2label": id2label, "label2id": {n: i for i, n in id2label.items()}}, indent=2)
    )
    write_examples(trainer.eval_dataset, names, output_dir)
    bank, calibration = bank if shared else (bank[0], calibration)  # shared: the bank's pass fitted T
    feature_bank = _save_feature_bank(bank, output_dir)
    run_info = {
        **_settings_record(plan),
        "image_size": [trainer.processing_class.size["height"], trainer.processing_class.size["width"]],
        "metrics": metrics,
        "bad_images": _bad_images(trainer),  # the training images skipped because they do not decode
        **task.record_fields(calibration, fitted),  # the calibration (and a multi-label run's threshold)
        "feature_bank": feature_bank,  # the out-of-distribution threshold fitted on validation, or why none
    }
    write_run_record(output_dir, {**run_info, "finished": False})  # the card links to it
    _plot_curves(trainer, training_args, output_dir, task)
    write_model_card(output_dir, run_info)
    # last: the record is the completion marker (run_record.is_finished), after the model, processor and labels
    write_run_record(output_dir, {**run_info, "finished": True})
    logger.info(run_summary(training_args.output_dir, metrics, task.best_metric, _sizes(splits)))


def _settings_record(plan: RunPlan) -> dict[str, Any]:
    """The run record's settings: what the arguments and the launch decided, before any result."""
    model_args, data_args, training_args = plan.arguments
    return {
        "recipe": plan.recipe,
        "base_model": model_args.model_name_or_path,
        "lora": model_args.peft,  # an adapter in adapter/ (LoRA or another peft method: "method" says which)
        "method": model_args.method,  # full, lora, or a probe on the frozen backbone (linear, knn)
        "data": {k: v for k, v in vars(data_args).items()},
        "seed": training_args.seed,
        "data_seed": training_args.data_seed,
        "world_size": training_args.world_size,
        "batch": batch_record(training_args),  # world size, per device, accumulation, global batch
        "compute": run_compute(training_args).record(),  # device, precision, kernels and why (utils.hardware)
        # the family defaults taken over the recipe's values, and why (arguments.family_defaults)
        "family_defaults": plan.family_defaults,
        "plan": plan.recorded,  # arguments.plan: what the run decided before training
        "written_by_process": training_args.process_index,
    }


def _sizes(splits: Any) -> dict[str, int]:
    """Images per split, where a split knows its length (a stream's evaluation splits are read by count)."""
    sizes = {}
    for name in ("validation", "test"):
        with contextlib.suppress(KeyError, TypeError):
            sizes[name] = len(splits[name])
    return sizes


def _result(split: str, metric: str, value: float, images: int | None) -> str:
    """"test accuracy 98.61 % (355/360)"; a metric that is not a fraction of images correct, as a number."""
    if metric.endswith("accuracy") and 0 <= value <= 1:
        counted = f" ({round(value * images)}/{images})" if images else ""
        return f"{split} {metric} {100 * value:.2f} %{counted}"
    return f"{split} {metric} {value:.4f}"


# what a finished output folder holds, in the order a user looks for it: (file, what it is)
_FOLDER_GUIDE = (
    ("model.safetensors", "the model"),
    ("adapter", "the LoRA adapter"),
    ("README.md", "its card: results, how to load it"),
    ("vit_ft_run.json", "what ran"),
    ("training_curves.png", "loss and metrics per evaluation"),
    ("examples", "a few validation images"),
)


def run_summary(output_dir: str | Path, metrics: dict[str, float], metric: str, sizes: dict[str, int]) -> str:
    """The run's last words: the headline `metric` on test (else validation) in words and counts, where the
    files are, and the commands to try next on this folder."""
    results = [
        _result(split, metric, metrics[f"{prefix}_{metric}"], sizes.get(split))
        for split, prefix in (("test", "test"), ("validation", "eval"))
        if f"{prefix}_{metric}" in metrics
    ]
    folder = Path(output_dir)
    found = [
        f"{name}{'/' if (folder / name).is_dir() else ''} ({what})"
        for name, what in _FOLDER_GUIDE
        if (folder / name).exists()
    ]
    name = folder.name or "model"
    return "\n".join(
        [
            "Finished: " + ("; ".join(results) if results else "no evaluation") + ".",
            f"In {output_dir}: " + ", ".join(found) + ".",
            "Next:",
            f"  vit-ft evaluate --model {output_dir} --output_dir reports/{name}   # report.md, confusion, mistakes",
            f"  vit-ft predict --model {output_dir} --output preds.csv IMAGES_OR_FOLDERS",
            f"  vit-ft export --model {output_dir} --output_dir exports/{name} --quantize int8   # ONNX",
            f"  python demo/app.py --model {output_dir}   # try it in the browser",
        ]
    )


def _shards_weights(trainer: Trainer) -> bool:
    """Whether each process holds only part of the weights (FSDP, DeepSpeed ZeRO-3): then every process runs the
    model's forward passes together, or the one that runs alone waits for the others forever."""
    deepspeed = trainer.accelerator.state.deepspeed_plugin
    return trainer.is_fsdp_enabled or (deepspeed is not None and deepspeed.zero_stage == 3)


def _save_feature_bank(bank: Any, output_dir: Path) -> dict[str, Any]:
    """`feature_bank.safetensors` written and its run-record entry, or {"written": False, "why": ...}."""
    from ..tasks.feature_bank import FEATURE_BANK_FILE

    if isinstance(bank, str):
        logger.info("No %s: %s.", FEATURE_BANK_FILE, bank)
        return {"written": False, "why": bank}
    bank.save(output_dir / FEATURE_BANK_FILE)
    return {"written": True, **bank.record()}


def _bank_size(trainer: Trainer, data_args: DataArguments) -> tuple[int, str]:
    """How many training images the feature bank holds (`pass_arguments.bank_images`: at most `bank_max_images`,
    at most as many as training saw) and why; 0 where there is none (a streamed split is never read whole)."""
    from ..arguments.pass_arguments import bank_images
    from ..data.training_split import reads_whole

    if not reads_whole(trainer.train_dataset):
        return 0, "a streamed training split is not read whole after training"
    steps, batch = trainer.state.global_step, batch_record(trainer.args)["global_batch"]
    return bank_images(data_args.bank_max_images, len(trainer.train_dataset), steps * batch or None)


def _shares_validation_pass(trainer: Trainer, data_args: DataArguments, task: Any) -> bool:
    """Whether one pass over the validation split gives both the calibration's logits and the bank threshold's
    features: the task fits a temperature and the bank fits its threshold on the whole split (no more than
    FIT_MAX_IMAGES, so the bank's pass covers every image calibration needs) with no probe's pass to read.
    Decided alike on every process; the pass runs where the bank's does (process zero, or every process where
    the weights are sharded), instead of predict's pass on every process and the bank's after it."""
    from ..tasks.feature_bank import FIT_MAX_IMAGES

    if not getattr(task, "fits_temperature", False) or trainer.eval_dataset is None:
        return False
    if "validation" in getattr(trainer, "frozen_features", {}) or not _bank_size(trainer, data_args)[0]:
        return False
    return 0 < len(trainer.eval_dataset) <= FIT_MAX_IMAGES


def _feature_bank(trainer: Trainer, data_args: DataArguments, seed: int, shared: bool = False) -> Any:
    """The feature bank (`tasks.feature_bank`) of the final model: its features of the training images (a
    class-stratified sample of `_bank_size` images) through the evaluation transform, with the out-of-distribution
    thresholds fitted on validation; or why there is none (`bank_max_images: none`; a streamed training split).
    With the calibration record of the same validation pass (`shared`, `_shares_validation_pass`; else None).
    Every process runs its share of the passes (`_bank_pass`); process zero builds the bank (every process
    where the weights are sharded), the others get (None, None)."""
    from ..tasks.feature_bank import FIT_MAX_IMAGES, build_feature_bank, stratified_rows

    count, why = _bank_size(trainer, data_args)
    if not count:
        return why, None
    transform = model_input_spec(trainer.processing_class, getattr(trainer.model, "config", None)).eval_transform()
    train = trainer.train_dataset.with_format(None)  # the stored images, not the training transform's crops
    labels = np.asarray(train["label"])  # class ids, or multi-hot rows
    rows = stratified_rows(labels, count, seed)
    validation, fit_rows = None, []
    if trainer.eval_dataset is not None:
        held_out = trainer.eval_dataset.with_format(None)
        fit_rows = range(min(len(held_out), FIT_MAX_IMAGES))
        validation = held_out.select(fit_rows)
    # a probe's passes over these rows (`training.probes`: the backbone unchanged since) serve instead of new ones
    frozen = getattr(trainer, "frozen_features", {})
    hidden = getattr(getattr(trainer.model, "config", None), "hidden_size", "hidden")
    reused = ", read from the probe's pass" if "train" in frozen else ""
    logger.info("Feature bank: %d of %d training images (%s), stratified, 2 x %s floats each%s; its threshold fitted "
                "on %d validation images.", len(rows), len(train), why, hidden, reused, len(fit_rows))  # fmt: skip
    images, calibration = None if validation is None else validation["image"], None
    if "validation" in frozen:
        fit = frozen["validation"].select(fit_rows)
    elif shared:
        fit, calibration = _shared_validation_pass(trainer, transform, images, validation["label"])
    elif images is not None and len(images):
        fit = _bank_pass(trainer, transform, images, desc="Feature bank, validation")
    else:
        fit = None
    train_images = train.select(rows)["image"]
    computed = frozen["train"].select(rows) if "train" in frozen else _bank_pass(trainer, transform, train_images)
    if computed is None:  # not process zero: its shares are with process zero, which builds the bank
        return None, None
    return build_feature_bank(trainer.model, transform, train_images, labels[rows], rows, images, computed,
                              fit), calibration  # fmt: skip


def _bank_pass(trainer: Trainer, transform: Any, images: Any, **kwargs: Any) -> Any:
    """`tasks.feature_bank.bank_features` of `images` for the bank: with several processes each passes its share
    (every world_size-th image from its index) and process zero gets them all back in order (None on the
    others); where the weights are sharded every process passes every image (each forward gathers them)."""
    from ..tasks.feature_bank import bank_features

    world, index = trainer.args.world_size, trainer.args.process_index
    if world == 1 or _shards_weights(trainer):
        return bank_features(trainer.model, transform, images, **kwargs)
    share = range(index, len(images), world)
    found, kept = bank_features(trainer.model, transform, [images[i] for i in share], **kwargs)
    shares = gather_to_zero((found, [share[k] for k in kept]))
    if shares is None:
        return None
    shares = [(found, kept) for found, kept in shares if kept]  # a share with no image that decodes adds none
    if not shares:
        return found, []
    kept = np.concatenate([np.asarray(kept, dtype=np.int64) for _, kept in shares])
    order = np.argsort(kept, kind="stable")
    return {space: np.concatenate([found[space] for found, _ in shares])[order] for space in shares[0][0]}, [
        int(i) for i in kept[order]
    ]


def _shared_validation_pass(
    trainer: Trainer, transform: Any, images: Any, labels: Any
) -> tuple[Any, dict[str, Any] | None]:
    """One pass of the final model over the validation `images` (their `labels`, class ids): both spaces'
    features for the bank's threshold (`bank_features`'s `(features, kept)`) and, on process zero, the calibration
    record of its logits (`tasks.temperature.temperature_of_logits`; an image that does not decode is left out of
    both). (None, None) on a process whose share went to process zero."""
    from ..tasks.temperature import temperature_of_logits

    logger.info("Calibration and the feature bank's threshold: one pass over the %d validation images gives the "
                "logits the temperature is fitted on and the features the threshold is.", len(images))  # fmt: skip
    passed = _bank_pass(trainer, transform, images, logits=True, desc="Calibration + feature bank, validation")
    if passed is None:  # its share is with process zero
        return None, None
    found, kept = passed
    logits = found.pop("logits")
    if not trainer.is_world_process_zero():  # sharded weights: every process passed every image, one fits
        return (found, kept), None
    return (found, kept), temperature_of_logits(logits, np.asarray(labels)[kept])


def _bad_images(trainer: Trainer) -> dict[str, Any] | None:
    """The training images skipped because they do not decode (`BadImageCallback.record`), if it counted them."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, BadImageCallback):
            return callback.record()
    return None


def _plot_curves(trainer: Trainer, training_args: TrainingArguments, output_dir: Path, task: Any) -> None:
    """training_curves.png with the task's metric panels and the model the run kept marked: its best checkpoint
    when it loaded that, else the final step."""
    from ..reports.reporting import plot_training_curves

    logger.info("Report: training_curves.png and the model card (README.md) in %s.", output_dir)
    best = trainer.state.best_model_checkpoint
    best_step = int(Path(best).name.rsplit("-", 1)[-1]) if best and training_args.load_best_model_at_end else None
    plot_training_curves(
        trainer.state.log_history,
        output_dir / "training_curves.png",
        evaluated_on=f"validation, {len(trainer.eval_dataset)} images" if trainer.eval_dataset else None,
        best_step=best_step,
        panels=task.curve_panels,
        metric=task.best_metric,
        kept_step=best_step if best_step is not None else trainer.state.global_step,
    )


__all__ = ["run_summary", "save_outputs"]
