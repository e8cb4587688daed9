"""Shared fixtures: tiny checkpoints written by transformers' own ViT classes, never downloaded."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel

from vit_ft import ViTFTConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 16,
    "patch_size": 4,
}


def tiny_hf_config(**overrides) -> ViTConfig:
    return ViTConfig(**{**TINY, **overrides})


def tiny_ft_config(**overrides) -> ViTFTConfig:
    return ViTFTConfig(**{**TINY, **overrides})


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter (LayerNorms and biases too) random values, so parity tests see them all."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()


@pytest.fixture(scope="session")
def hf_backbone_dir(tmp_path_factory) -> str:
    """A transformers ViTModel checkpoint (with pooler, no head), like google/vit-base-patch16-224-in21k."""
    path = tmp_path_factory.mktemp("hf_backbone")
    randomize(ViTModel(tiny_hf_config())).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_classifier_dir(tmp_path_factory) -> str:
    """A transformers ViTForImageClassification checkpoint with three named labels."""
    path = tmp_path_factory.mktemp("hf_classifier")
    labels = ["ant", "bee", "wasp"]
    config = tiny_hf_config(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    randomize(ViTForImageClassification(config), seed=1).save_pretrained(path)
    return str(path)
