"""VPT's prompt tokens (`prompts.py`, config `vpt_tokens` / `vpt_deep`): shallow prompts are register tokens
after the model's own (the registers are checked against transformers' Dinov2WithRegisters), at any resolution
and under rotary positions; deep prompts against VPT's per-block replacement written out here; NaFlex padding and
the attention pooling leave them out; saved and reloaded with the model; no transformers class claims them."""

from __future__ import annotations

import pytest
import torch

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.model.family_export import transformers_export_reason

from ..conftest import TINY, randomize

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

PROMPTS = 3


def vpt_model(**config) -> ViTFTForImageClassification:
    return randomize(ViTFTForImageClassification(ViTFTConfig(**{**TINY, "num_labels": 4, "vpt_tokens": PROMPTS, **config}))).eval()


def as_registers(model: ViTFTForImageClassification) -> ViTFTForImageClassification:
    """The same weights in a model whose register tokens are its registers, then the shallow prompts."""
    config = model.config.to_dict() | {"vpt_tokens": 0, "num_register_tokens": model.config.num_register_tokens + PROMPTS}
    reference = ViTFTForImageClassification(ViTFTConfig(**config)).eval()
    state = {k: v for k, v in model.state_dict().items() if k != "vit.prompts.tokens"}
    own = state.pop("vit.embeddings.register_tokens", torch.zeros(1, 0, model.config.hidden_size))
    state["vit.embeddings.register_tokens"] = torch.cat([own, model.vit.prompts.tokens], dim=1)
    reference.load_state_dict(state)
    return reference


@pytest.mark.parametrize("options", [{}, {"num_register_tokens": 2}, {"pooling": "mean"}, {"pooling": "cls+mean"},
                                     {"rope_theta": 100.0}],
                         ids=["cls", "registers", "mean", "cls+mean", "rotary"])  # fmt: skip
@pytest.mark.parametrize("size", [(16, 16), (24, 20)], ids=["224-like", "resampled"])
def test_shallow_prompts_are_tokens_after_the_prefix_left_out_of_the_pooling(options, size):
    model = vpt_model(**options)
    assert model.config.num_prefix_tokens == 1 + options.get("num_register_tokens", 0) + PROMPTS
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(pixels, output_hidden_states=True)
        reference = as_registers(model)(pixels, output_hidden_states=True)
    torch.testing.assert_close(ours.logits, reference.logits, atol=1e-5, rtol=0)
    patches = (size[0] // 4) * (size[1] // 4)
    assert ours.hidden_states[-1].shape[1] == model.config.num_prefix_tokens + patches


def test_deep_prompts_replace_each_blocks_input_prompts():
    model = vpt_model(vpt_deep=True, num_register_tokens=1)
    vit, start = model.vit, 2  # after the class token and the register
    assert vit.prompts.tokens.shape == (TINY["num_hidden_layers"], PROMPTS, TINY["hidden_size"])
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x = vit.embeddings(pixels)
        for index, layer in enumerate(vit.layers):  # VPT's forward_deep_prompt: drop the last prompts, put new ones
            prompts = vit.prompts.tokens[index].expand(2, -1, -1)
            x = torch.cat([x[:, :start], prompts, x[:, start + (PROMPTS if index else 0):]], dim=1)
            x = layer(x)
        expected = model.classifier(vit.layernorm(x)[:, 0])
        torch.testing.assert_close(model(pixels).logits, expected, atol=1e-5, rtol=0)
        vit.prompts.tokens[1].add_(torch.randn(PROMPTS, TINY["hidden_size"]))  # the second block's own are read
        assert not torch.allclose(model(pixels).logits, expected, atol=1e-4)


@pytest.mark.parametrize("pooling", ["map", "mean"])
def test_naflex_padding_and_attention_pooling_leave_the_prompts_out(pooling):
    model = vpt_model(class_token=False, no_embed_class=True, pooling=pooling, max_num_patches=24)
    patches = torch.randn(1, 12, 48, generator=torch.Generator().manual_seed(3))
    alone = {"pixel_attention_mask": torch.ones(1, 12), "spatial_shapes": torch.tensor([[3, 4]])}
    padded = torch.cat([patches, torch.randn(1, 12, 48)], dim=1)  # junk in the padding
    mask = torch.cat([torch.ones(1, 12), torch.zeros(1, 12)], dim=1)
    with torch.no_grad():
        one = model.vit(patches, **alone)
        together = model.vit(padded, pixel_attention_mask=mask, spatial_shapes=torch.tensor([[3, 4]]))
        torch.testing.assert_close(together.pooler_output, one.pooler_output, atol=1e-5, rtol=0)
        tokens = one.last_hidden_state[:, PROMPTS:]  # no class token: the prompts come first
        expected = model.vit.attn_pool(tokens) if pooling == "map" else tokens.mean(dim=1)
        torch.testing.assert_close(one.pooler_output, expected, atol=1e-5, rtol=0)


def test_prompts_are_saved_with_the_model_and_initialised_as_vpt(tmp_path):
    model = vpt_model(vpt_deep=True)
    bound = (6.0 / (3 * 4 * 4 + TINY["hidden_size"])) ** 0.5  # VPT's uniform bound over the patch's fan-in
    fresh = ViTFTForImageClassification(model.config).vit.prompts.tokens
    assert fresh.abs().max() <= bound and fresh.abs().max() > bound / 2
    model.save_pretrained(tmp_path)
    reloaded = ViTFTForImageClassification.from_pretrained(tmp_path).eval()
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(pixels).logits, model(pixels).logits, atol=1e-6, rtol=0)
    assert "VPT prompt tokens" in transformers_export_reason(model.config)


@pytest.mark.parametrize(("fields", "words"), [({"vpt_tokens": -1}, "vpt_tokens must be"),
                                               ({"vpt_tokens": 0, "vpt_deep": True}, "at least 1 with vpt_deep")])  # fmt: skip
def test_bad_prompt_config_is_one_line(fields, words):
    with pytest.raises(ValueError, match=words):
        ViTFTConfig(**{**TINY, **fields})
