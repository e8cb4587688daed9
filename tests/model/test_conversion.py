import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTForImageClassification

from vit_ft import convert_hf_vit_state_dict, to_hf_vit_state_dict
from vit_ft.model.conversion import DISCARDED_KEYS

from ..conftest import randomize, tiny_hf_config


def test_backbone_keys_all_accounted_for(hf_backbone_dir):
    source = load_file(f"{hf_backbone_dir}/model.safetensors")
    converted, discarded = convert_hf_vit_state_dict(source)
    assert sorted(discarded) == sorted(DISCARDED_KEYS)
    # q, k, v of each layer become one tensor: 3 source tensors (x2 for bias) -> 1 (x2)
    assert len(converted) == len(source) - len(discarded) - 2 * 2 * 2
    qkv = converted["layers.1.attention.qkv.weight"]
    assert qkv.shape == (96, 32)
    torch.testing.assert_close(
        qkv[32:64], source["encoder.layer.1.attention.attention.key.weight"], rtol=0, atol=0
    )


def test_round_trip_to_transformers_keys(hf_classifier_dir):
    source = load_file(f"{hf_classifier_dir}/model.safetensors")
    converted, _ = convert_hf_vit_state_dict(source)
    back = to_hf_vit_state_dict(converted, num_hidden_layers=2)
    assert sorted(back) == sorted(source)
    for key, tensor in source.items():
        assert torch.equal(back[key], tensor), key


def test_live_transformers5_state_dict_is_understood():
    model = randomize(ViTForImageClassification(tiny_hf_config(num_labels=3)))
    converted, _ = convert_hf_vit_state_dict(model.state_dict())
    assert "layers.0.attention.qkv.bias" in converted and "classifier.weight" in converted


def test_unknown_key_is_named():
    with pytest.raises(KeyError, match="encoder.layer.0.attention.rotary.weight"):
        convert_hf_vit_state_dict({"encoder.layer.0.attention.rotary.weight": torch.zeros(1)})


def test_incomplete_qkv_is_named():
    state = {"encoder.layer.0.attention.attention.query.weight": torch.zeros(4, 4)}
    with pytest.raises(KeyError, match=r"missing \['key', 'value'\]"):
        convert_hf_vit_state_dict(state)
