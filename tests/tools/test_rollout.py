import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft import ViTFTModel
from vit_ft.tools.explain.rollout import attention_rollout, overlay_heatmap, rollout_maps

from ..conftest import randomize, tiny_ft_config


def test_uniform_attention_gives_a_uniform_map():
    tokens = 17
    uniform = torch.full((2, 4, tokens, tokens), 1.0 / tokens)
    out = attention_rollout([uniform, uniform, uniform])
    torch.testing.assert_close(out, torch.full((2, 16), 1.0 / 16))


def test_single_layer_matches_the_formula():
    torch.manual_seed(0)
    attn = torch.softmax(torch.randn(1, 2, 5, 5), dim=-1)
    fused = 0.5 * attn.mean(1) + 0.5 * torch.eye(5)
    fused = fused / fused.sum(-1, keepdim=True)
    expected = fused[:, 0, 1:] / fused[:, 0, 1:].sum(-1, keepdim=True)
    torch.testing.assert_close(attention_rollout([attn]), expected)


def test_cls_attending_to_one_patch_lights_it_up():
    tokens = 5
    attn = torch.zeros(1, 1, tokens, tokens)
    attn[0, 0, :, 3] = 1.0  # every token attends to patch index 2 (token 3)
    out = attention_rollout([attn, attn])
    assert out.argmax().item() == 2


def test_model_maps_have_the_grid_shape_and_overlay_the_image():
    model = randomize(ViTFTModel(tiny_ft_config()))
    maps = rollout_maps(model, torch.randn(2, 3, 16, 24))
    assert maps.shape == (2, 4, 6)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(2))
    image = Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8))
    overlay = overlay_heatmap(image, maps[0])
    assert overlay.size == (60, 40) and np.asarray(overlay).max() > 0


def test_bad_fusion_is_an_error():
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout([torch.ones(1, 1, 2, 2)], head_fusion="median")


def test_overlay_is_a_blend_in_which_the_image_stays_visible():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    heat = np.zeros((4, 4), dtype=np.float32)
    heat[1, 2], heat[3, 0] = 1.0, 0.5
    overlay = np.asarray(overlay_heatmap(image, heat), dtype=np.float32)
    base = np.asarray(image, dtype=np.float32)
    upsampled = (
        np.asarray(Image.fromarray(np.uint8(heat * 255)).resize((64, 64), Image.Resampling.BICUBIC)) / 255
    )
    hot, cold = upsampled > 0.8, upsampled < 0.02
    assert hot.sum() > 50 and cold.sum() > 1000
    # where the model looks most the map is coloured, with the image still under it (not an opaque colour)
    assert np.abs(overlay[hot] - base[hot]).mean() > 40
    assert np.corrcoef(overlay[hot].ravel(), base[hot].ravel())[0, 1] > 0.5
    # where it does not look, the image is as it was
    assert np.abs(overlay[cold] - base[cold]).max() <= 0.02 * 0.6 * 255 + 1
