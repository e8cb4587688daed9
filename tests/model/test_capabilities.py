"""The capability flags ViTFTPreTrainedModel declares as transformers' ViT does, each exercised here:
`_supports_attention_backend`, `_can_compile_fullgraph`, `_supports_flex_attn`, `_supports_flash_attn`
(`_supports_sdpa`: tests/model/test_pretrained_contract.py)."""

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.utils import is_flash_attn_2_available

from vit_ft import ViTFTForImageClassification, ViTFTModel, ViTFTPreTrainedModel

from ..conftest import randomize, tiny_ft_config

CLASSES = [ViTFTModel, ViTFTForImageClassification]


def main_output(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(pixels)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.fixture
def pixels() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("cls", CLASSES)
def test_a_registered_attention_function_is_used(hf_classifier_dir, cls, pixels):
    """_supports_attention_backend: any function in transformers' attention registry, at load time or after."""
    assert ViTFTPreTrainedModel._supports_attention_backend
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("vit_ft_test_counting", counting)
    reference = main_output(cls.from_pretrained(hf_classifier_dir, attn_implementation="sdpa"), pixels)
    model = cls.from_pretrained(hf_classifier_dir, attn_implementation="vit_ft_test_counting")
    assert model.config._attn_implementation == "vit_ft_test_counting"
    assert torch.equal(main_output(model, pixels), reference) and len(calls) == 2  # two layers
    model.set_attn_implementation("sdpa")
    main_output(model, pixels)
    assert len(calls) == 2


@pytest.mark.parametrize("cls", CLASSES)
def test_the_forward_compiles_in_one_graph(cls, pixels):
    """_can_compile_fullgraph: the forward (and training with a loss) is one graph, as for transformers' ViT; and
    torch.compile(fullgraph=True) gives the eager results. (Recording hidden states breaks the classifier's graph
    in two, for transformers' ViTForImageClassification as for ours: transformers' output capturing.)"""
    assert ViTFTPreTrainedModel._can_compile_fullgraph
    torch._dynamo.reset()
    model = randomize(cls(tiny_ft_config(num_labels=3)))
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(pixels)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    if cls is ViTFTForImageClassification:
        explained = torch._dynamo.explain(model.train())(pixels, labels=torch.tensor([0, 2]))
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    else:  # the encoder records its hidden states and attention maps in the same one graph
        for kwargs in ({"output_hidden_states": True}, {"output_attentions": True}):
            with torch.no_grad():
                explained = torch._dynamo.explain(model)(pixels, **kwargs)
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), (
                kwargs,
                explained.break_reasons,
            )
    compiled = torch.compile(model.eval(), fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(pixels)[0], model(pixels)[0])


@pytest.mark.long  # inductor compiles flex attention on the CPU (about a minute): CI's own step
def test_flex_attention_matches_sdpa(pixels):
    """_supports_flex_attn: transformers' flex attention (compiled by inductor on CPU: about a minute)."""
    assert ViTFTPreTrainedModel._supports_flex_attn
    model = randomize(ViTFTModel(tiny_ft_config()))
    expected = main_output(model, pixels)
    model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "flex_attention"
    torch.testing.assert_close(main_output(model, pixels), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and is_flash_attn_2_available()), reason="needs a CUDA GPU and flash-attn"
)
def test_flash_attention_matches_sdpa(pixels):
    """_supports_flash_attn: flash-attn 2 on a GPU, in bf16, against SDPA."""
    assert ViTFTPreTrainedModel._supports_flash_attn
    model = randomize(ViTFTModel(tiny_ft_config())).to("cuda", torch.bfloat16)
    pixels = pixels.to("cuda", torch.bfloat16)
    expected = main_output(model, pixels).float()
    model.set_attn_implementation("flash_attention_2")
    torch.testing.assert_close(main_output(model, pixels).float(), expected, rtol=2e-2, atol=2e-2)
