"""transformers' ViT layout -> ours through the production path (`from_pretrained` with the weight conversion),
and ours -> transformers' keys (`to_hf_vit_state_dict`, the export)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ViTForImageClassification

from vit_ft import ViTFTForImageClassification, ViTFTModel, to_hf_vit_state_dict
from vit_ft.model.conversion import DISCARDED_KEYS

from ..conftest import randomize, tiny_ft_config, tiny_hf_config


def test_backbone_keys_all_accounted_for(hf_backbone_dir):
    source = load_file(f"{hf_backbone_dir}/model.safetensors")
    model = ViTFTModel.from_pretrained(hf_backbone_dir)
    report = model.loading_report
    assert sorted(report.discarded) == sorted(DISCARDED_KEYS)
    # q, k, v of each layer become one tensor: 3 source tensors (x2 for bias) -> 1 (x2)
    assert len(report.loaded) == len(source) - len(report.discarded) - 2 * 2 * 2
    assert report.newly_initialized == []
    qkv = model.layers[1].attention.qkv.weight
    assert qkv.shape == (96, 32)
    torch.testing.assert_close(
        qkv[32:64], source["encoder.layer.1.attention.attention.key.weight"], rtol=0, atol=0
    )


def test_round_trip_to_transformers_keys(hf_classifier_dir):
    source = load_file(f"{hf_classifier_dir}/model.safetensors")
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir)
    back = to_hf_vit_state_dict(model.state_dict(), num_hidden_layers=2)
    assert sorted(back) == sorted(source)
    for key, tensor in source.items():
        assert torch.equal(back[key], tensor), key


def test_live_transformers5_state_dict_is_understood():
    """The in-memory names of transformers >= 5 (q_proj, o_proj, layers.N) load as the on-disk ones do."""
    reference = randomize(ViTForImageClassification(tiny_hf_config(num_labels=3)))
    live = reference.state_dict()
    assert any(".attention.q_proj." in key for key in live)  # the layout this test is about
    model = ViTFTForImageClassification.from_pretrained(
        None, config=tiny_ft_config(num_labels=3), state_dict=live
    )
    assert "layers.0.attention.qkv.bias" in model.loading_report.loaded
    assert "classifier.weight" in model.loading_report.loaded and model.loading_report.newly_initialized == []
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (model(pixels).logits - reference(pixels).logits).abs().max() <= 1e-5


def test_unknown_key_is_named(hf_backbone_dir, tmp_path):
    source = load_file(f"{hf_backbone_dir}/model.safetensors")
    save_file(
        {**source, "encoder.layer.0.attention.rotary.weight": torch.zeros(1)}, tmp_path / "model.safetensors"
    )
    shutil.copy(f"{hf_backbone_dir}/config.json", tmp_path / "config.json")
    # named in our layout: transformers renames encoder.layer.N to layers.N before it finds no place for it
    with pytest.raises(ValueError, match=r"layers\.0\.attention\.rotary\.weight"):
        ViTFTModel.from_pretrained(tmp_path)


def test_incomplete_qkv_is_named(hf_backbone_dir, tmp_path):
    source = load_file(f"{hf_backbone_dir}/model.safetensors")
    lacking = {k: v for k, v in source.items() if not k.startswith("encoder.layer.0.attention.attention.key")}
    lacking = {
        k: v for k, v in lacking.items() if not k.startswith("encoder.layer.0.attention.attention.value")
    }
    save_file(lacking, tmp_path / "model.safetensors")
    shutil.copy(f"{hf_backbone_dir}/config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match=r"layers\.0\.attention\.qkv.*missing \[.key., .value.\]"):
        ViTFTModel.from_pretrained(tmp_path)
