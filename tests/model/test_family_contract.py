"""transformers' PreTrainedModel contract (tests/model/test_pretrained_contract.py) on one tiny model per family
(tests/model/conftest.py FAMILY_CONFIGS: DeiT's distillation token, DINOv2's layer scale and registers, CLIP's
pre-norm, SigLIP's attention pooling without class token): save/load round trip, recorded hidden states and
attention maps, tuples, gradient checkpointing, eager == SDPA, torch.compile of the forward in one graph, and the
CPU kernels (`vit_ft.kernels.kernelize`) giving the same logits."""

from __future__ import annotations

import copy

import pytest
import torch

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.kernels import KERNELS_ENV, kernelize

from ..conftest import enable_checkpointing, randomize
from .conftest import FAMILY_CONFIGS


def family_model(name: str, seed: int = 0, **overrides) -> ViTFTForImageClassification:
    """The family's tiny classifier (3 labels), every parameter random (norms, scales and tokens too)."""
    config = ViTFTConfig(**{**FAMILY_CONFIGS[name], **overrides}, num_labels=3)
    return randomize(ViTFTForImageClassification(config), seed=seed)


@pytest.fixture
def pixels() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def logits(model: torch.nn.Module, pixels: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(pixels, **kwargs).logits


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_save_pretrained_round_trip(tmp_path, name, pixels):
    model = family_model(name)
    model.save_pretrained(tmp_path)
    loaded = ViTFTForImageClassification.from_pretrained(tmp_path).eval()
    assert loaded.loading_report.source_format == "vit_ft" and loaded.loading_report.newly_initialized == []
    assert loaded.config.to_diff_dict() == model.config.to_diff_dict()
    # same weights bit for bit; the logits within fp32 rounding, as a loaded tensor may sit at another memory
    # alignment, which changes the BLAS path of a one-row product (SigLIP's pooling query)
    assert all(
        torch.equal(a, b)
        for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    )
    torch.testing.assert_close(logits(loaded, pixels), logits(model, pixels), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_outputs_tuples_and_eager_equals_sdpa(name, pixels):
    model = family_model(name)
    config, tokens = model.config, model.config.num_prefix_tokens + 16  # prefix + a 4x4 grid
    with torch.no_grad():
        out = model(pixels, output_hidden_states=True, output_attentions=True)
        as_tuple = model(pixels, return_dict=False)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert all(h.shape == (2, tokens, 32) for h in out.hidden_states)  # (B, prefix + N, hidden)
    assert len(out.attentions) == config.num_hidden_layers
    assert all(a.shape == (2, 4, tokens, tokens) for a in out.attentions)  # (B, heads, T, T)
    sdpa = logits(model, pixels)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], sdpa)
    model.set_attn_implementation("eager")
    torch.testing.assert_close(logits(model, pixels), sdpa, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits, sdpa, atol=1e-5, rtol=0)  # the maps' eager path, same logits


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_gradient_checkpointing_keeps_gradients(name, pixels):
    grads = []
    for checkpointing in (False, True):
        model = family_model(name, seed=3).train()
        if checkpointing:
            enable_checkpointing(model)
            assert all(layer.gradient_checkpointing for layer in model.vit.layers)
        model(pixels, labels=torch.tensor([0, 2])).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], msg=key)


@pytest.mark.parametrize("name", [name for name in FAMILY_CONFIGS if name != "vit"])
def test_the_forward_compiles_in_one_graph(name, pixels):
    """One forward per family (the plain ViT's in test_capabilities.py): about 2 s each."""
    torch._dynamo.reset()
    model = family_model(name).eval()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(pixels)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(logits(compiled, pixels), logits(model, pixels))


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_kernels_give_the_same_logits(monkeypatch, name, pixels):
    monkeypatch.setenv(KERNELS_ENV, "1")
    model = family_model(name)
    fast = kernelize(copy.deepcopy(model))
    assert fast.config._attn_implementation == "vit_ft_sdpa"
    torch.testing.assert_close(logits(fast, pixels), logits(model, pixels), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [name for name in FAMILY_CONFIGS if name != "vit"])
def test_lora_step_then_merged_equals_unmerged(name, pixels):
    """LoRA (the "attention+mlp" preset, `vit_ft.training.lora`) on each family: one optimizer step moves the
    adapters and the head only, and the merged model gives the adapter model's logits."""
    from vit_ft.arguments.fields import ModelArguments
    from vit_ft.training.lora import apply_lora, merge_lora

    base = family_model(name)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    args = ModelArguments(use_lora=True, lora_target_modules="attention+mlp", lora_dropout=0.0)
    model = apply_lora(base, args).train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("attention.qkv.lora_A" in n for n in trainable) and any(
        "mlp.fc2.lora_B" in n for n in trainable
    )
    if name == "deit":  # its second head is trained too
        assert any("distillation_classifier.modules_to_save" in n for n in trainable)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(pixel_values=pixels, labels=torch.tensor([0, 2])).loss.backward()
    optimizer.step()
    merged = merge_lora(model.eval())
    assert type(merged) is ViTFTForImageClassification
    moved = {n for n, p in merged.named_parameters() if not torch.equal(p, before[n])}
    assert moved and not any("embeddings" in n or "norm" in n for n in moved)  # frozen stays frozen
    with torch.no_grad():
        unmerged = model(pixel_values=pixels).logits
    torch.testing.assert_close(logits(merged, pixels), unmerged, atol=1e-5, rtol=0)
