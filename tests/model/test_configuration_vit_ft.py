import pytest
from transformers import ViTConfig

from vit_ft import VIT_SIZES, ViTFTConfig, ViTFTModel


def test_field_names_match_transformers_vit_config():
    ours, theirs = ViTFTConfig().to_dict(), ViTConfig().to_dict()
    shared = [
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps",
        "image_size", "patch_size", "num_channels", "qkv_bias",
    ]  # fmt: skip
    for name in shared:
        assert ours[name] == theirs[name], name


@pytest.mark.parametrize(
    ("variant", "width", "depth", "heads"),
    [
        ("tiny", 192, 12, 3),
        ("small", 384, 12, 6),
        ("base", 768, 12, 12),
        ("large", 1024, 24, 16),
        ("huge", 1280, 32, 16),
    ],
)
def test_named_sizes(variant, width, depth, heads):
    config = ViTFTConfig.from_variant(variant, patch_size=14 if variant == "huge" else 16)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (width, depth, heads)
    assert config.intermediate_size == 4 * width
    assert set(VIT_SIZES) == {"tiny", "small", "base", "large", "huge"}


def test_unknown_variant_lists_choices():
    with pytest.raises(ValueError, match="base.*huge|huge.*base"):
        ViTFTConfig.from_variant("gigantic")


def test_image_size_pair_and_grid():
    config = ViTFTConfig(image_size=[224, 320], patch_size=16)
    assert config.image_hw == (224, 320)
    assert config.grid_size == (14, 20)
    assert ViTFTConfig(image_size=384).grid_size == (24, 24)


def test_heads_must_divide_hidden_size_when_the_model_is_built():
    """As transformers: ViTConfig accepts it, the attention module refuses it."""
    config = ViTFTConfig(hidden_size=100, num_attention_heads=12)
    ViTConfig(hidden_size=100, num_attention_heads=12)
    with pytest.raises(
        ValueError, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(12\)"
    ):
        ViTFTModel(config)


def test_image_size_must_be_multiple_of_patch_size_when_the_model_is_built():
    config = ViTFTConfig(image_size=380, patch_size=16)
    with pytest.raises(ValueError, match=r"not divisible by patch_size.*e\.g\. \(384, 384\)"):
        ViTFTModel(config)


@pytest.mark.parametrize(
    "bad",
    [{"pooling": "max"}, {"hidden_dropout_prob": 1.5}, {"image_size": "big"}, {"mlp_type": "geglu"},
     {"rope_rescale": 2.0}, {"rope_jitter": 0.5, "rope_theta": 100.0}],
)
def test_bad_values_are_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ViTFTConfig(**bad)


def test_round_trip(tmp_path):
    config = ViTFTConfig(
        image_size=[32, 48], patch_size=8, hidden_size=64, num_attention_heads=4, pooling="mean"
    )
    config.save_pretrained(tmp_path)
    loaded = ViTFTConfig.from_pretrained(tmp_path)
    assert loaded.image_hw == (32, 48) and loaded.pooling == "mean" and loaded.model_type == "vit_ft"
