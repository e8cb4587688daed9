"""The built-in data and checkpoint a recipe may name, made when missing (main process first): the built-in
dataset's image folders (`data.builtin`) and the small digits ViT pre-trained on them (`pretrain`)."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import TrainingArguments

from ..arguments.fields import DataArguments, ModelArguments
from ..data.builtin import write_builtin_dataset
from ..data.digits import write_digits_imagefolder

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


__all__ = ["prepare_builtin_checkpoint", "prepare_builtin_data"]
