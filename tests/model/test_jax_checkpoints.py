"""The ViT paper's JAX .npz files: a hand-built file with the names and layouts of google-research/
vision_transformer (as timm's `_load_weights` reads them) loads and matches transformers' ViT on the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import ViTForImageClassification

from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel
from vit_ft.model.formats import checkpoint_normalization
from vit_ft.model.jax_format import convert_jax_state_dict, jax_config_fields, read_npz_shapes

from ..conftest import TINY, randomize, tiny_hf_config

CLASSES = 5


def hf_reference(seed: int = 0) -> ViTForImageClassification:
    """transformers' ViT with flax's LayerNorm eps (1e-6), every parameter random."""
    return randomize(
        ViTForImageClassification(tiny_hf_config(layer_norm_eps=1e-6, num_labels=CLASSES)), seed=seed
    )


# transformers' ViT layer tensors by role: on-disk names, then the in-memory names of transformers >= 5
HF_LAYER = {
    "query": ("attention.attention.query", "attention.q_proj"),
    "key": ("attention.attention.key", "attention.k_proj"),
    "value": ("attention.attention.value", "attention.v_proj"),
    "out": ("attention.output.dense", "attention.o_proj"),
    "ln1": ("layernorm_before",),
    "ln2": ("layernorm_after",),
    "fc1": ("intermediate.dense", "mlp.fc1"),
    "fc2": ("output.dense", "mlp.fc2"),
}


def hf_layer(state_dict: dict[str, torch.Tensor], index: int, role: str, kind: str) -> torch.Tensor:
    for prefix in (f"vit.encoder.layer.{index}.", f"vit.layers.{index}."):
        for name in HF_LAYER[role]:
            if f"{prefix}{name}.{kind}" in state_dict:
                return state_dict[f"{prefix}{name}.{kind}"]
    raise KeyError(f"layer {index} {role} {kind}")


def npz_arrays_from_hf(model: ViTForImageClassification) -> dict[str, np.ndarray]:
    """The arrays of a ViT .npz for the reference's numbers: Dense kernels (in, out), the patch kernel HWIO,
    query/key/value kernels (hidden, heads, head_dim), biases (heads, head_dim), the output kernel
    (heads, head_dim, hidden)."""
    hidden, heads = model.config.hidden_size, model.config.num_attention_heads
    head_dim = hidden // heads
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {
        "cls": sd["vit.embeddings.cls_token"],
        "Transformer/posembed_input/pos_embedding": sd["vit.embeddings.position_embeddings"],
        "embedding/kernel": sd["vit.embeddings.patch_embeddings.projection.weight"].permute(
            2, 3, 1, 0
        ),  # HWIO
        "embedding/bias": sd["vit.embeddings.patch_embeddings.projection.bias"],
        "Transformer/encoder_norm/scale": sd["vit.layernorm.weight"],
        "Transformer/encoder_norm/bias": sd["vit.layernorm.bias"],
        "head/kernel": sd["classifier.weight"].t(),
        "head/bias": sd["classifier.bias"],
    }
    for i in range(model.config.num_hidden_layers):
        p, mha = (
            f"Transformer/encoderblock_{i}/",
            f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/",
        )
        for name in ("query", "key", "value"):
            out[f"{mha}{name}/kernel"] = hf_layer(sd, i, name, "weight").t().reshape(hidden, heads, head_dim)
            out[f"{mha}{name}/bias"] = hf_layer(sd, i, name, "bias").reshape(heads, head_dim)
        out[f"{mha}out/kernel"] = hf_layer(sd, i, "out", "weight").t().reshape(heads, head_dim, hidden)
        out[f"{mha}out/bias"] = hf_layer(sd, i, "out", "bias")
        for jax_name, role in (("LayerNorm_0", "ln1"), ("LayerNorm_2", "ln2")):
            out[f"{p}{jax_name}/scale"] = hf_layer(sd, i, role, "weight")
            out[f"{p}{jax_name}/bias"] = hf_layer(sd, i, role, "bias")
        for r, role in enumerate(("fc1", "fc2")):
            out[f"{p}MlpBlock_3/Dense_{r}/kernel"] = hf_layer(sd, i, role, "weight").t()
            out[f"{p}MlpBlock_3/Dense_{r}/bias"] = hf_layer(sd, i, role, "bias")
    return {name: np.ascontiguousarray(t.numpy()) for name, t in out.items()}


@pytest.fixture(scope="module")
def reference():
    return hf_reference()


@pytest.fixture(scope="module")
def npz_file(reference, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("jax") / "ViT-T_4.npz"
    np.savez(path, **npz_arrays_from_hf(reference))
    return path


def pixels(size: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(5))


def test_config_is_read_from_the_shapes(npz_file):
    fields = jax_config_fields(read_npz_shapes(npz_file), "file")
    assert {k: fields[k] for k in TINY} == TINY
    assert fields["layer_norm_eps"] == 1e-6 and len(fields["id2label"]) == CLASSES
    config = ViTFTConfig.from_pretrained(npz_file)
    assert config.num_attention_heads == TINY["num_attention_heads"] and config.num_labels == CLASSES


def test_npz_matches_transformers_vit(reference, npz_file):
    model = ViTFTForImageClassification.from_pretrained(npz_file).eval()
    assert model.loading_report.source_format == "JAX npz" and model.loading_report.head == "kept"
    assert model.config.name_or_path == str(npz_file)
    with torch.no_grad():
        assert (model(pixels()).logits - reference(pixels()).logits).abs().max().item() <= 1e-5


def test_folder_holding_one_npz_and_prefixed_names(reference, tmp_path):
    """A folder with the file loads the same; files saved with optimizer state nest names under opt/target/."""
    np.savez(tmp_path / "ViT.npz", **{f"opt/target/{k}": v for k, v in npz_arrays_from_hf(reference).items()})
    model = ViTFTModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        diff = (
            (model(pixels()).last_hidden_state - reference.vit(pixels()).last_hidden_state).abs().max().item()
        )
    assert diff <= 1e-5


def test_new_labels_and_resolution(reference, npz_file):
    model = ViTFTForImageClassification.from_pretrained(npz_file, num_labels=2, image_size=24).eval()
    assert model.loading_report.head == "new" and torch.count_nonzero(model.classifier.weight) == 0
    assert model.loading_report.resampled["embeddings.position_embeddings"] == ((4, 4), (6, 6))
    with torch.no_grad():
        ours = model.vit(pixels(24)).last_hidden_state
        theirs = reference.vit(pixels(24), interpolate_pos_encoding=True).last_hidden_state
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_pre_logits_are_discarded_with_the_head(reference, tmp_path):
    """ImageNet-21k files carry a representation layer under the head; fine-tuning drops both (paper, Sec. 3.1)."""
    arrays = npz_arrays_from_hf(reference)
    hidden = TINY["hidden_size"]
    arrays.update(
        {
            "pre_logits/kernel": np.eye(hidden, dtype=np.float32),
            "pre_logits/bias": np.zeros(hidden, np.float32),
        }
    )
    np.savez(tmp_path / "in21k.npz", **arrays)
    model = ViTFTForImageClassification.from_pretrained(tmp_path / "in21k.npz", num_labels=3)
    assert model.config.num_labels == 3 and model.loading_report.head == "new"
    assert set(model.loading_report.discarded) >= {
        "pre_logits/kernel",
        "pre_logits/bias",
        "head/kernel",
        "head/bias",
    }
    with torch.no_grad():
        diff = (
            (model.vit(pixels()).last_hidden_state - reference.vit(pixels()).last_hidden_state)
            .abs()
            .max()
            .item()
        )
    assert diff <= 1e-5


def test_pure_conversion_names_unknown_arrays(reference, npz_file):
    arrays = npz_arrays_from_hf(reference)
    config = ViTFTConfig(**jax_config_fields(read_npz_shapes(npz_file), "file"))
    state_dict, discarded = convert_jax_state_dict(arrays, config)
    assert not discarded and len(state_dict) == len(ViTFTForImageClassification(config).state_dict())
    with pytest.raises(KeyError, match="Transformer/encoderblock_0/extra"):
        convert_jax_state_dict({**arrays, "Transformer/encoderblock_0/extra": np.zeros(1)}, config)


def test_not_a_vit_npz_is_one_clear_error(tmp_path):
    np.savez(tmp_path / "resnet.npz", **{"conv_root/kernel": np.zeros((7, 7, 3, 8), np.float32)})
    with pytest.raises(ValueError, match="not a ViT .npz") as error:
        ViTFTForImageClassification.from_pretrained(tmp_path / "resnet.npz")
    assert "\n" not in str(error.value)
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        np.savez(tmp_path / "two" / f"{name}.npz", x=np.zeros(1))
    with pytest.raises(ValueError, match="several .npz"):
        ViTFTForImageClassification.from_pretrained(tmp_path / "two")


def test_normalization_is_the_papers(npz_file):
    assert checkpoint_normalization(npz_file) == {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
