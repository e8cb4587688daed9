"""Our model classes keep transformers' PreTrainedModel contract (what transformers' ModelTesterMixin checks),
each compared with transformers' own ViTModel / ViTForImageClassification loaded the same way."""

import socket
import warnings

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTConfig, ViTForImageClassification, ViTModel

import vit_ft.model.modeling_vit_ft
from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize, tiny_ft_config

# (ours, transformers' reference)
PAIRS = [(ViTFTModel, ViTModel), (ViTFTForImageClassification, ViTForImageClassification)]
CLASSES = [ours for ours, _ in PAIRS]
HEAD = {"classifier.weight", "classifier.bias"}


@pytest.fixture
def pixels() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def main_output(model: torch.nn.Module, pixels: torch.Tensor, **kwargs) -> torch.Tensor:
    """The logits of a classifier, the last hidden state of an encoder."""
    with torch.no_grad():
        out = model(pixels, **kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# 1. dtype ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
@pytest.mark.parametrize("keyword", ["dtype", "torch_dtype"])
def test_dtype_keywords_give_bf16_parameters(hf_backbone_dir, cls, ref_cls, keyword, pixels):
    reference = ref_cls.from_pretrained(hf_backbone_dir, **{keyword: torch.bfloat16})
    model = cls.from_pretrained(hf_backbone_dir, **{keyword: torch.bfloat16})
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert main_output(model, pixels).dtype == torch.bfloat16


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
def test_dtype_auto_gives_the_checkpoint_dtype(hf_backbone_dir, tmp_path, cls, ref_cls):
    ref_cls.from_pretrained(hf_backbone_dir).to(torch.bfloat16).save_pretrained(tmp_path / "ref")
    cls.from_pretrained(hf_backbone_dir).to(torch.bfloat16).save_pretrained(tmp_path / "ours")
    assert ref_cls.from_pretrained(tmp_path / "ref", dtype="auto").dtype == torch.bfloat16
    assert cls.from_pretrained(tmp_path / "ours", dtype="auto").dtype == torch.bfloat16
    # and a transformers bf16 checkpoint loads into ours as bf16 too
    assert cls.from_pretrained(tmp_path / "ref", dtype="auto").dtype == torch.bfloat16


# 2. attention implementation -----------------------------------------------------------------------------


@pytest.fixture
def eager_calls(monkeypatch) -> list:
    """Counts the calls of vit_ft's eager attention function."""
    calls = []
    original = vit_ft.model.modeling_vit_ft.eager_attention_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(vit_ft.model.modeling_vit_ft, "eager_attention_forward", counting)
    return calls


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
def test_attn_implementation_at_load_time(hf_classifier_dir, cls, ref_cls, eager_calls, pixels):
    outputs = {}
    for implementation in ("eager", "sdpa"):
        reference = ref_cls.from_pretrained(hf_classifier_dir, attn_implementation=implementation)
        model = cls.from_pretrained(hf_classifier_dir, attn_implementation=implementation)
        assert reference.config._attn_implementation == implementation
        assert model.config._attn_implementation == implementation
        eager_calls.clear()
        outputs[implementation] = main_output(model, pixels)
        assert len(eager_calls) == (model.config.num_hidden_layers if implementation == "eager" else 0)
    assert max_diff(outputs["eager"], outputs["sdpa"]) <= 1e-5


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
def test_set_attn_implementation_after_loading(hf_classifier_dir, cls, ref_cls, eager_calls, pixels):
    reference = ref_cls.from_pretrained(hf_classifier_dir, attn_implementation="sdpa")
    reference.set_attn_implementation("eager")
    assert reference.config._attn_implementation == "eager"
    model = cls.from_pretrained(hf_classifier_dir, attn_implementation="sdpa")
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    main_output(model, pixels)
    assert len(eager_calls) == model.config.num_hidden_layers


@pytest.mark.parametrize("cls", CLASSES)
def test_output_attentions_match_transformers_eager(hf_backbone_dir, cls, pixels):
    reference = ViTModel.from_pretrained(hf_backbone_dir, attn_implementation="eager")
    model = cls.from_pretrained(hf_backbone_dir)
    with torch.no_grad():
        expected = reference(pixels, output_attentions=True).attentions
        got = model(pixels, output_attentions=True).attentions
    assert len(got) == model.config.num_hidden_layers
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.shape == (2, 4, 17, 17)  # (B, heads, N, N)
        torch.testing.assert_close(ours.sum(-1), torch.ones(2, 4, 17))
        assert max_diff(ours, theirs) <= 1e-5


# 3. output_loading_info -----------------------------------------------------------------------------------


def test_loading_info_sets_and_same_labels_checkpoint(hf_classifier_dir):
    _, expected = ViTForImageClassification.from_pretrained(hf_classifier_dir, output_loading_info=True)
    _, info = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert isinstance(expected[key], set) and isinstance(info[key], set), key
    assert info["missing_keys"] == info["unexpected_keys"] == set()


def test_loading_info_backbone_into_classifier(hf_backbone_dir, pixels):
    _, expected = ViTForImageClassification.from_pretrained(
        hf_backbone_dir, num_labels=5, output_loading_info=True
    )
    model, info = ViTFTForImageClassification.from_pretrained(
        hf_backbone_dir, num_labels=5, output_loading_info=True
    )
    assert HEAD.issubset(expected["missing_keys"]) and HEAD.issubset(info["missing_keys"])
    assert isinstance(info["unexpected_keys"], set) and isinstance(info["mismatched_keys"], set)
    assert model.classifier.weight.shape == (5, 32)
    assert torch.count_nonzero(model.classifier.weight) == torch.count_nonzero(model.classifier.bias) == 0
    assert set(model.loading_report.newly_initialized) == HEAD
    assert "pooler" in str(model.loading_report) and "discarded" in str(model.loading_report)


# 4. ignore_mismatched_sizes -------------------------------------------------------------------------------


def test_ignore_mismatched_sizes_gives_a_new_zero_head(hf_classifier_dir):
    reference, expected = ViTForImageClassification.from_pretrained(
        hf_classifier_dir, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    model, info = ViTFTForImageClassification.from_pretrained(
        hf_classifier_dir, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    # transformers lists the head as mismatched, ours as missing: either way it is new
    assert HEAD.issubset(expected["missing_keys"] | {name for name, *_ in expected["mismatched_keys"]})
    assert HEAD.issubset(info["missing_keys"] | {name for name, *_ in info["mismatched_keys"]})
    assert reference.classifier.out_features == model.classifier.out_features == 5
    assert torch.count_nonzero(model.classifier.weight) == torch.count_nonzero(model.classifier.bias) == 0


def test_new_labels_without_ignore_mismatched_sizes_replace_the_head(hf_classifier_dir):
    """Our addition: transformers raises without ignore_mismatched_sizes=True; ours replaces the head (zero)."""
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, num_labels=5)
    assert model.classifier.weight.shape == (5, 32)
    assert torch.count_nonzero(model.classifier.weight) == 0
    assert "replaced" in str(model.loading_report)
    assert set(model.loading_report.newly_initialized) == HEAD


# 5. state_dict= -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
def test_from_pretrained_none_with_config_and_state_dict(
    hf_classifier_dir, tmp_path, monkeypatch, cls, ref_cls, pixels
):
    """`from_pretrained(None, config=, state_dict=)` loads with the network cut off."""
    saved = cls.from_pretrained(hf_classifier_dir)
    saved.save_pretrained(tmp_path / "ours")
    ref_cls.from_pretrained(hf_classifier_dir).save_pretrained(tmp_path / "ref")

    def no_network(*args, **kwargs):
        raise AssertionError("from_pretrained(None, state_dict=...) tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    reference = ref_cls.from_pretrained(
        None,
        config=ViTConfig.from_pretrained(tmp_path / "ref"),
        state_dict=load_file(tmp_path / "ref" / "model.safetensors"),
    )
    config = ViTFTConfig.from_pretrained(tmp_path / "ours")
    model = cls.from_pretrained(
        None, config=config, state_dict=load_file(tmp_path / "ours" / "model.safetensors")
    )
    assert max_diff(main_output(model, pixels), main_output(saved, pixels)) == 0
    assert max_diff(main_output(model, pixels), main_output(reference, pixels)) <= 1e-5


# 6. meta device -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
def test_from_pretrained_under_meta_device_behaves_as_transformers(hf_classifier_dir, cls, ref_cls, pixels):
    try:
        with torch.device("meta"):
            ref_cls.from_pretrained(hf_classifier_dir)
    except Exception as error:  # transformers refuses: ours must refuse the same way
        with pytest.raises(type(error)), torch.device("meta"):
            cls.from_pretrained(hf_classifier_dir)
    else:  # transformers loads the real weights: so must ours
        with torch.device("meta"):
            model = cls.from_pretrained(hf_classifier_dir)
        assert not any(p.is_meta for p in model.parameters())
        assert (
            max_diff(main_output(model, pixels), main_output(cls.from_pretrained(hf_classifier_dir), pixels))
            == 0
        )


# 7. hub and loading keywords ------------------------------------------------------------------------------


LOADING_KEYWORDS = {
    "low_cpu_mem_usage": True,
    "revision": "main",
    "cache_dir": "<tmp_path>",
    "local_files_only": True,
    "token": None,
    "device_map": "cpu",
}


@pytest.mark.parametrize(("cls", "ref_cls"), PAIRS)
@pytest.mark.parametrize("keyword", list(LOADING_KEYWORDS))
def test_loading_keywords_are_accepted(hf_classifier_dir, tmp_path, cls, ref_cls, keyword, pixels):
    if keyword == "device_map":
        pytest.importorskip("accelerate")
    kwargs = {keyword: tmp_path if keyword == "cache_dir" else LOADING_KEYWORDS[keyword]}
    ref_cls.from_pretrained(hf_classifier_dir, **kwargs)
    model = cls.from_pretrained(hf_classifier_dir, **kwargs)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert (
        max_diff(main_output(model, pixels), main_output(cls.from_pretrained(hf_classifier_dir), pixels)) == 0
    )


# 8. save / load round trip --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
def test_save_pretrained_round_trip(hf_classifier_dir, tmp_path, cls, pixels):
    model = cls.from_pretrained(hf_classifier_dir)
    model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = cls.from_pretrained(tmp_path)
    assert max_diff(main_output(loaded, pixels), main_output(model, pixels)) == 0
    assert loaded.config.id2label == model.config.id2label
    assert loaded.config.label2id == model.config.label2id
    assert loaded.loading_report.source_format == "vit_ft"


def test_fine_tuning_a_saved_folder_keeps_its_resolution_when_image_size_is_unset(hf_classifier_dir, tmp_path):
    """`--model_name_or_path <a saved vit_ft folder>` without --image_size, as from a transformers checkpoint
    (training.model.build_model): the saved size, the new labels, the encoder's weights; it raised before."""
    from vit_ft.arguments.fields import ModelArguments
    from vit_ft.training.model import build_model

    reference = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, image_size=24)
    reference.save_pretrained(tmp_path)
    for source, size in ((hf_classifier_dir, 16), (str(tmp_path), 24)):  # TINY is 16 px
        model, processor = build_model(ModelArguments(model_name_or_path=source), ["x", "y"])
        assert model.config.image_hw == (size, size) and processor.size == {"height": size, "width": size}
        assert model.config.id2label == {0: "x", 1: "y"}
    assert torch.equal(model.vit.embeddings.position_embeddings, reference.vit.embeddings.position_embeddings)


# 9. outputs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
def test_output_hidden_states_match_transformers(hf_classifier_dir, cls, pixels):
    reference = ViTForImageClassification.from_pretrained(hf_classifier_dir, attn_implementation="eager")
    model = cls.from_pretrained(hf_classifier_dir)
    with torch.no_grad():
        expected = reference(pixels, output_hidden_states=True).hidden_states
        got = model(pixels, output_hidden_states=True).hidden_states
    assert len(got) == model.config.num_hidden_layers + 1
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.shape == (2, 17, 32)  # (B, N + 1, hidden)
        assert max_diff(ours, theirs) <= 1e-5


@pytest.mark.parametrize("cls", CLASSES)
def test_return_dict_false_gives_a_tuple(hf_classifier_dir, cls, pixels):
    model = cls.from_pretrained(hf_classifier_dir)
    with torch.no_grad():
        output = model(pixels, return_dict=False)
    assert isinstance(output, tuple)
    assert max_diff(output[0], main_output(model, pixels)) == 0


# 10. gradient checkpointing -------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
def test_gradient_checkpointing_enable_keeps_gradients(cls):
    """The deprecated-but-supported `gradient_checkpointing_enable()` (default kwargs) in train mode."""
    config = tiny_ft_config(num_labels=3)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    grads = []
    for checkpointing in (False, True):
        model = randomize(cls(config), seed=3).train()
        if checkpointing:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.gradient_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.base_model.layers)
        calls = []
        model.base_model.layers[0].attention.register_forward_hook(lambda *args, seen=calls: seen.append(1))
        out = model(pixels)
        loss = out.logits.square().sum() if hasattr(out, "logits") else out.last_hidden_state.square().sum()
        loss.backward()
        assert len(calls) == (2 if checkpointing else 1)  # checkpointing recomputes the layer in backward
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


# 11. head replacement -------------------------------------------------------------------------------------


def test_new_id2label_replaces_the_head_and_keeps_the_encoder(hf_classifier_dir, pixels):
    reference = ViTForImageClassification.from_pretrained(hf_classifier_dir)
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, id2label={0: "cat", 1: "dog"})
    assert model.classifier.out_features == 2
    assert torch.count_nonzero(model.classifier.weight) == torch.count_nonzero(model.classifier.bias) == 0
    with torch.no_grad():
        expected = reference.vit(pixels).last_hidden_state
        assert max_diff(model.vit(pixels).last_hidden_state, expected) <= 1e-5


# 12. torch.export -----------------------------------------------------------------------------------------


def test_torch_export_of_the_inference_forward(hf_classifier_dir, pixels):
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir).eval()
    program = torch.export.export(model, (pixels,))
    with torch.no_grad():
        out = program.module()(pixels)
    logits = out.logits if hasattr(out, "logits") else out[0]
    assert max_diff(logits, main_output(model, pixels)) <= 1e-5


# 13. config validation ------------------------------------------------------------------------------------


def test_hidden_size_not_divisible_by_heads_is_accepted_by_config_refused_by_model():
    """transformers' ViTConfig accepts hidden 30 / 4 heads, so ours does; our model refuses to build it, where
    transformers 5.23's ViTModel no longer checks and silently projects attention to 4 x 7 = 28 dims."""
    overrides = {"hidden_size": 30, "num_attention_heads": 4}
    ViTConfig(**overrides)
    config = tiny_ft_config(**overrides)
    assert config.hidden_size == 30
    for cls in CLASSES:
        with pytest.raises(ValueError, match="divisible"):
            cls(config)
