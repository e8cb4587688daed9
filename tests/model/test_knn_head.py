"""The kNN head (`head_type: knn`) as a saved model: the bank travels in model.safetensors and `knn_head.py` with
the folder's code (a clean process without vit_ft gives the same logits), save -> load keeps them, and the ONNX
graph carries the bank and gives PyTorch's logits."""

from __future__ import annotations

import pytest
import torch

from vit_ft import ViTFTConfig, ViTFTForImageClassification

from ..conftest import TINY, randomize
from .test_export import run_in_clean_process


def _knn_model(multi_label: bool = False) -> ViTFTForImageClassification:
    problem = "multi_label_classification" if multi_label else "single_label_classification"
    config = ViTFTConfig(**TINY, num_labels=3, head_type="knn", knn_bank_size=30, knn_k=5, problem_type=problem)
    model = randomize(ViTFTForImageClassification(config), seed=2)
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 2, (30, 3), generator=generator) if multi_label else torch.arange(30) % 3
    model.classifier.fill(torch.randn(30, config.hidden_size, generator=generator), labels)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_knn_folder_keeps_its_bank_and_loads_in_a_clean_process(tmp_path, multi_label):
    model = _knn_model(multi_label)
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "knn_head.py").is_file()
    pixels = torch.randn(2, 3, 20, 28)
    with torch.no_grad():
        expected = model(pixels).logits
        reloaded = ViTFTForImageClassification.from_pretrained(tmp_path / "model")(pixels).logits
    assert torch.equal(reloaded, expected)
    out = run_in_clean_process(tmp_path / "model", pixels, tmp_path)
    assert (torch.tensor(out["logits"]) - expected).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_knn_head_exports_to_onnx_with_its_bank(tmp_path):
    pytest.importorskip("onnxruntime")
    from vit_ft.tools.export.onnx import FP32_TOLERANCE, export_model

    model = _knn_model()
    _, difference = export_model(model, tmp_path / "model.onnx")
    assert difference <= FP32_TOLERANCE


def test_a_knn_config_without_a_bank_is_refused():
    with pytest.raises(ValueError, match="knn_bank_size >= 1"):
        ViTFTConfig(**TINY, num_labels=3, head_type="knn")
    with pytest.raises(ValueError, match="head_type must be 'linear', 'knn' or 'zeroshot'"):
        ViTFTConfig(**TINY, num_labels=3, head_type="mlp")
