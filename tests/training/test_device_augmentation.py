"""The Trainer's per-batch device augmentation (in process, a tiny ViT, seconds): each training micro-batch of
uint8 crops is augmented once, before the model, gradient accumulation included; evaluation never is."""

import numpy as np
import torch
from PIL import Image
from transformers import ViTImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.fields import DataArguments
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments
from vit_ft.data.batch_augmentation import BatchAugmentation
from vit_ft.tasks import SingleLabel
from vit_ft.training.data import load_data
from vit_ft.training.inputs import attach_transforms, build_mixup
from vit_ft.training.trainer import build_trainer

from ..conftest import tiny_ft_config


def test_training_micro_batches_are_augmented_on_the_device_and_evaluation_is_not(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("test", 6)):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / name / f"{i}.png")
    data_args = DataArguments(
        train_dir=str(tmp_path / "train"), test_dir=str(tmp_path / "test"), validation_split_percentage=0.0,
        check_images=False, auto_augment="randaugment", random_erasing_prob=0.5, mixup_alpha=0.8,
    )  # fmt: skip
    args = FineTuneTrainingArguments(
        output_dir=str(tmp_path / "out"), eval_strategy="no", save_strategy="no", report_to="none",
        max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2, remove_unused_columns=False,
        label_names=["labels"], seed=0, use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    splits, names = load_data(data_args, args)
    splits["validation"] = splits["test"]
    torch.manual_seed(0)
    model = ViTFTForImageClassification(tiny_ft_config(image_size=8, num_labels=2))
    transform = attach_transforms(splits, ViTImageProcessorPil(size={"height": 8, "width": 8}), data_args, seed=0)
    mixup = build_mixup(data_args, args, len(names))
    seen, inputs = [], []
    augment, forward = BatchAugmentation.__call__, model.forward

    def spy(self, batch):
        out = augment(self, batch)
        seen.append((batch["pixel_values"].dtype, out["labels"].shape))
        return out

    def model_inputs(pixel_values=None, **kwargs):
        inputs.append(pixel_values.dtype)
        return forward(pixel_values=pixel_values, **kwargs)

    monkeypatch.setattr(BatchAugmentation, "__call__", spy)
    monkeypatch.setattr(model, "forward", model_inputs)
    trainer, _ = build_trainer(
        model, None, splits, args, data_args, SingleLabel(), [transform, mixup], train_collator=mixup.collate
    )
    assert trainer.batch_augmentation.mixup is mixup and trainer.train_collator != mixup.collate
    trainer.train()
    # 3 steps x 2 micro-batches, each once, mixed into soft targets; the model gets the normalised floats
    assert seen == [(torch.uint8, (4, 2))] * 6 and inputs == [torch.float32] * 6
    trainer.evaluate()
    assert len(seen) == 6 and len(inputs) > 6  # evaluation ran the model, not the augmentation
