"""Fixtures shared by the model tests: the family checkpoints saved by transformers (test_families.py), and one tiny
vit_ft config per family (FAMILY_CONFIGS: the options each family's checkpoints load as)."""

from ..conftest import TINY
from .test_families import checkpoints  # noqa: F401 - a fixture, for test_timm_families.py too

# family -> the tiny config's options beyond the plain ViT's (hidden 32, 2 layers, 16 px, 4 px patches)
FAMILY_OPTIONS = {
    "vit": {},
    "deit": {"distillation_token": True},
    "dinov2": {"layerscale_value": 0.1, "pooling": "cls+mean", "layer_norm_eps": 1e-6},
    "dinov2_registers": {"layerscale_value": 0.1, "num_register_tokens": 2, "pos_embed_antialias": True,
                         "pooling": "cls+mean"},
    "clip": {"pre_norm": True, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5},
    "siglip": {"class_token": False, "no_embed_class": True, "pooling": "map", "hidden_act": "gelu_pytorch_tanh"},
    "dinov3": {"rope_theta": 100.0, "num_register_tokens": 2, "layerscale_value": 0.1, "mlp_type": "swiglu",
               "layer_norm_eps": 1e-5},
    "mae": {"pooling": "mean", "fc_norm": True},  # MAE's fine-tuning layout
    "aimv2": {"norm_type": "rmsnorm", "patch_norm": True, "mlp_type": "swiglu", "qkv_bias": False,
              "proj_bias": False, "mlp_bias": False, "class_token": False, "no_embed_class": True, "pooling": "attn"},
}  # fmt: skip
FAMILY_CONFIGS = {name: {**TINY, **options} for name, options in FAMILY_OPTIONS.items()}
