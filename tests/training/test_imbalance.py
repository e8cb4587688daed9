"""Imbalanced classes end to end on a deliberately skewed generated folder (in process, a tiny ViT, seconds):
class weights in the loss and the balanced sampler each raise the minority class's recall."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.metrics import recall_score
from transformers import ViTImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.fields import DataArguments
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments
from vit_ft.tasks import SingleLabel
from vit_ft.training.data import load_data
from vit_ft.training.inputs import attach_transforms
from vit_ft.training.trainer import build_trainer

from ..conftest import tiny_ft_config

COUNTS = {"train": {"common": 120, "rare": 4}, "test": {"common": 30, "rare": 30}}


def _write_folder(root: Path) -> None:
    """Grey 8x8 images whose brightness overlaps between the classes (common ~ 0.4, rare ~ 0.6, sd 0.1): with a
    30:1 skew the best unweighted threshold sits far into the rare class's side, the balanced one midway."""
    rng = np.random.default_rng(0)
    for split, counts in COUNTS.items():
        for name, count in counts.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                level = rng.normal(0.4 if name == "common" else 0.6, 0.1)
                pixels = np.clip(level + rng.normal(0, 0.02, (8, 8, 1)), 0, 1).repeat(3, axis=2)
                Image.fromarray((pixels * 255).astype(np.uint8)).save(folder / f"{i}.png")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("skewed")
    _write_folder(root)
    return root


def _minority_recall(root: Path, tmp: Path, **knobs) -> float:
    data_args = DataArguments(
        train_dir=str(root / "train"), test_dir=str(root / "test"), validation_split_percentage=0.0,
        horizontal_flip=False, crop_scale_min=1.0, check_images=False,
    )  # fmt: skip
    args = FineTuneTrainingArguments(
        output_dir=str(tmp), eval_strategy="no", save_strategy="no", report_to="none", learning_rate=3e-3,
        num_train_epochs=5, per_device_train_batch_size=16, remove_unused_columns=False, label_names=["labels"],
        seed=0, use_cpu=True, disable_tqdm=True, **knobs,
    )  # fmt: skip
    splits, names = load_data(data_args, args)
    splits["validation"] = splits["test"]
    task = SingleLabel()
    weights = task.loss_weights(args, splits["train"], names)
    train_labels = task.train_labels(splits["train"])  # before the transforms, as the fine-tune reads them
    torch.manual_seed(0)  # the same initial weights for every run, whatever ran before in this process
    model = ViTFTForImageClassification(tiny_ft_config(image_size=8, num_labels=2))
    processor = ViTImageProcessorPil(size={"height": 8, "width": 8})
    transform = attach_transforms(splits, processor, data_args, seed=0)
    trainer, _ = build_trainer(
        model, processor, splits, args, data_args, task, [transform], weights, None, balanced_labels=train_labels
    )
    trainer.train()
    prediction = trainer.predict(splits["test"])
    predicted = prediction.predictions.argmax(-1)
    return recall_score(prediction.label_ids, predicted, labels=[names.index("rare")], average="macro")


def test_class_weights_and_the_balanced_sampler_raise_minority_recall(skewed, tmp_path):
    plain = _minority_recall(skewed, tmp_path / "plain")
    weighted = _minority_recall(skewed, tmp_path / "weighted", class_weights="balanced")
    sampled = _minority_recall(skewed, tmp_path / "sampled", balanced_sampler=True)
    # measured: 0.10 plain, 0.23 with class weights, 0.67 with the sampler (fixed initial weights and seed)
    assert plain < 0.3, plain  # the skew wins without help
    assert weighted >= plain + 0.1 and sampled >= plain + 0.3, (plain, weighted, sampled)
