"""vit_ft.tasks.temperature: the temperature a fine-tune fits on its validation split, through a real Trainer."""

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments

from vit_ft import ViTFTForImageClassification
from vit_ft.data.transforms import collate_fn
from vit_ft.metrics.calibration import fit_temperature, negative_log_likelihood
from vit_ft.tasks.temperature import MIN_CALIBRATION_IMAGES, calibration_record, fit_and_record_temperature
from vit_ft.utils.run_record import recorded_temperature

from ..conftest import randomize, tiny_ft_config


def test_the_trainers_validation_logits_give_the_recorded_temperature(tmp_path):
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3, image_size=16)))
    generator = torch.Generator().manual_seed(0)
    examples = [
        {"pixel_values": torch.randn(3, 16, 16, generator=generator), "labels": i % 3} for i in range(40)
    ]
    args = TrainingArguments(tmp_path, per_device_eval_batch_size=16, report_to=[], use_cpu=True)
    trainer = Trainer(model=model, args=args, data_collator=collate_fn)
    record = fit_and_record_temperature(trainer, examples)
    with torch.no_grad():
        logits = model(pixel_values=torch.stack([e["pixel_values"] for e in examples])).logits.numpy()
    labels = np.arange(40) % 3
    assert record["images"] == 40 and record["split"] == "validation"
    assert record["temperature"] == pytest.approx(fit_temperature(logits, labels), rel=1e-4)
    assert record["nll"][0] == pytest.approx(negative_log_likelihood(logits, labels), rel=1e-4)
    assert record["nll"][1] <= record["nll"][0]
    assert recorded_temperature({"calibration": record}) == record["temperature"]


def test_a_split_too_small_to_fit_keeps_the_raw_probabilities():
    logits = np.array([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0]])
    record = calibration_record(logits, np.array([1, 1, 0]))
    assert MIN_CALIBRATION_IMAGES > 3 and record["temperature"] == 1.0 and "fewer than" in record["note"]
    assert record["nll"][0] == record["nll"][1]
