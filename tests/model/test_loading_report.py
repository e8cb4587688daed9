"""The loading report (vit_ft.model.conversion.LoadingReport): what it says, and that a load prints it once."""

import logging

import torch

from vit_ft import ViTFTForImageClassification, ViTFTModel

HEAD_LINE = "new head: {} labels, zero-initialised (classifier.weight, classifier.bias)"


def load_logged(caplog, capfd, *args, **kwargs):
    """from_pretrained with every logger at INFO; the model and all it printed (log records, stdout, stderr)."""
    capfd.readouterr()
    caplog.clear()  # records of earlier loads in the test (vit_ft may log at INFO after another test's setup)
    with caplog.at_level(logging.INFO):
        model = ViTFTForImageClassification.from_pretrained(*args, **kwargs)
    out, err = capfd.readouterr()
    return model, "\n".join([*(r.getMessage() for r in caplog.records), out, err])


def test_from_pretrained_prints_the_report_once_with_the_new_head(hf_backbone_dir, caplog, capfd):
    model, printed = load_logged(caplog, capfd, hf_backbone_dir, num_labels=5, image_size=32)
    assert printed.count("Loaded 30 tensors from") == 1  # 30: tiny ViTModel's 34 less pooler and fused qkv
    assert printed.count(HEAD_LINE.format(5)) == 1
    assert "LOAD REPORT" not in printed and "MISSING" not in printed  # transformers' table, silenced
    assert "resampled embeddings.position_embeddings: 4x4 -> 8x8" in printed
    assert torch.count_nonzero(model.classifier.weight) == 0  # the report's "zero-initialised" is true


def test_reloaded_fine_tune_says_its_head_is_kept(hf_backbone_dir, caplog, capfd, tmp_path):
    ViTFTForImageClassification.from_pretrained(hf_backbone_dir, num_labels=3).save_pretrained(tmp_path)
    model, printed = load_logged(caplog, capfd, tmp_path)
    assert printed.count("head kept: 3 labels (the checkpoint's own)") == 1 and "new head" not in printed
    assert model.loading_report.head == "kept" and model.loading_report.newly_initialized == []


def test_silenced_table_keeps_loading_info_and_other_new_keys(hf_backbone_dir):
    model, info = ViTFTModel.from_pretrained(hf_backbone_dir, num_hidden_layers=3, output_loading_info=True)
    assert info["missing_keys"] == set(model.loading_report.newly_initialized) != set()
    report = str(model.loading_report)
    assert "newly initialised: layers.2." in report and "head" not in report  # no head in a ViTFTModel
    # a second load starts clean: nothing held back from the first is given to it
    _, again = ViTFTForImageClassification.from_pretrained(
        hf_backbone_dir, num_labels=2, output_loading_info=True
    )
    assert again["missing_keys"] == {"classifier.weight", "classifier.bias"}


def test_a_fine_tune_prints_the_report_once(tiny_finetuned_dir):
    log = (tiny_finetuned_dir.parent / "finetune.log").read_text()
    assert log.count("Loaded 30 tensors from") == 1
    assert log.count(HEAD_LINE.format(10)) == 1  # the ten digits
    assert "LOAD REPORT" not in log
