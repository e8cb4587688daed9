"""vit_ft.tasks.temperature: the temperature a fine-tune fits on its validation split, through a real Trainer."""

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments

from vit_ft import ViTFTForImageClassification
from vit_ft.data.collate import collate_fn
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



def test_under_several_processes_only_process_zero_fits_and_every_process_gets_its_record(tmp_path, monkeypatch):
    """Two "processes" in turn (process index and broadcast stood in for): each predicts, one fit runs, on
    process zero, and process one returns the record process zero broadcast."""
    from vit_ft.tasks import temperature

    generator = torch.Generator().manual_seed(1)
    examples = [
        {"pixel_values": torch.randn(3, 16, 16, generator=generator), "labels": i % 3} for i in range(30)
    ]
    args = TrainingArguments(tmp_path, per_device_eval_batch_size=16, report_to=[], use_cpu=True)
    rank, fits, sent = {"index": 0}, [], []
    real_fit = temperature.fit_temperature
    monkeypatch.setattr(temperature, "fit_temperature", lambda *a: fits.append(rank["index"]) or real_fit(*a))

    def broadcast_object(value):  # process zero's value on every process, as torch.distributed's would give
        if rank["index"] == 0:
            sent.append(value)
        return sent[0]

    monkeypatch.setattr(temperature, "broadcast_object", broadcast_object)
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3, image_size=16)))
    records, predicted = [], []
    for index in (0, 1):
        rank["index"] = index
        trainer = Trainer(model=model, args=args, data_collator=collate_fn)
        monkeypatch.setattr(trainer, "is_world_process_zero", lambda index=index: index == 0)
        predict = trainer.predict
        monkeypatch.setattr(
            trainer, "predict", lambda *a, predict=predict, **k: predicted.append(rank["index"]) or predict(*a, **k)
        )
        records.append(fit_and_record_temperature(trainer, examples))
    assert predicted == [0, 1] and fits == [0]  # every process predicts (Trainer gathers); one fit
    assert len(sent) == 1 and records[0] is sent[0] and records[1] is sent[0]
    assert records[0]["images"] == 30 and "nll" in records[0]
