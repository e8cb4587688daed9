"""Parity with transformers' ViT built from the same random weights, and the model's own behaviour."""

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel

from vit_ft import ViTFTForImageClassification, ViTFTModel

from ..conftest import enable_checkpointing, randomize, tiny_ft_config, tiny_hf_config

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def reference(hf_backbone_dir):
    return ViTModel.from_pretrained(hf_backbone_dir, attn_implementation="eager").eval()


def test_native_resolution_parity(hf_backbone_dir, reference):
    ours = ViTFTModel.from_pretrained(hf_backbone_dir)
    pixels = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert max_diff(ours(pixels).last_hidden_state, reference(pixels).last_hidden_state) <= 1e-5
    assert ours.loading_report.resampled == {}
    assert set(ours.loading_report.discarded) == {"pooler.dense.weight", "pooler.dense.bias"}


@pytest.mark.parametrize("image_size", [32, (16, 32), (24, 8)])
def test_higher_and_non_square_resolution_parity(hf_backbone_dir, reference, image_size):
    ours = ViTFTModel.from_pretrained(hf_backbone_dir, image_size=image_size)
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    assert ours.config.grid_size == (height // 4, width // 4)
    assert ours.loading_report.resampled["embeddings.position_embeddings"] == (
        (4, 4),
        (height // 4, width // 4),
    )
    pixels = torch.randn(2, 3, height, width)
    with torch.no_grad():
        expected = reference(pixels, interpolate_pos_encoding=True).last_hidden_state
        assert max_diff(ours(pixels).last_hidden_state, expected) <= 1e-5


def test_runtime_resampling_of_other_input_sizes(hf_backbone_dir, reference):
    ours = ViTFTModel.from_pretrained(hf_backbone_dir)  # table at 4x4
    pixels = torch.randn(2, 3, 20, 28)
    with torch.no_grad():
        expected = reference(pixels, interpolate_pos_encoding=True).last_hidden_state
        assert max_diff(ours(pixels).last_hidden_state, expected) <= 1e-5


def test_input_not_multiple_of_patch_size_is_a_clear_error(hf_backbone_dir):
    ours = ViTFTModel.from_pretrained(hf_backbone_dir)
    with pytest.raises(ValueError, match=r"18x16 is not a multiple of the patch size 4x4"):
        ours(torch.randn(1, 3, 18, 16))


def test_classifier_checkpoint_parity_and_labels(hf_classifier_dir):
    reference = ViTForImageClassification.from_pretrained(hf_classifier_dir).eval()
    ours = ViTFTForImageClassification.from_pretrained(hf_classifier_dir)
    assert ours.config.id2label == reference.config.id2label == {0: "ant", 1: "bee", 2: "wasp"}
    assert ours.config.label2id == reference.config.label2id
    assert ours.loading_report.newly_initialized == []
    pixels = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert max_diff(ours(pixels).logits, reference(pixels).logits) <= 1e-5


def test_new_head_is_zero_initialised_when_labels_change(hf_classifier_dir):
    labels = {0: "cat", 1: "dog"}
    ours = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, id2label=labels, image_size=32)
    assert ours.config.num_labels == 2 and ours.config.label2id == {"cat": 0, "dog": 1}
    assert ours.loading_report.newly_initialized == ["classifier.weight", "classifier.bias"]
    assert "classifier.weight" in ours.loading_report.discarded
    assert torch.count_nonzero(ours.classifier.weight) == 0 and torch.count_nonzero(ours.classifier.bias) == 0
    report = str(ours.loading_report)
    assert "4x4 -> 8x8" in report and "new head: 2 labels, zero-initialised" in report


def test_backbone_checkpoint_gets_a_new_head(hf_backbone_dir, reference):
    ours = ViTFTForImageClassification.from_pretrained(hf_backbone_dir, num_labels=5)
    assert ours.classifier.weight.shape == (5, 32)
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        # a zero head: logits are zero, and the encoder still equals the reference
        assert torch.count_nonzero(ours(pixels).logits) == 0
        assert max_diff(ours.vit(pixels).last_hidden_state, reference(pixels).last_hidden_state) <= 1e-5


def test_own_folder_round_trip_keeps_logits(hf_classifier_dir, tmp_path):
    ours = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, image_size=(16, 24))
    ours.save_pretrained(tmp_path)
    loaded = ViTFTForImageClassification.from_pretrained(tmp_path)
    assert loaded.loading_report.source_format == "vit_ft"
    pixels = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert max_diff(loaded(pixels).logits, ours(pixels).logits) == 0
    # and at a higher resolution again, from our own format
    bigger = ViTFTForImageClassification.from_pretrained(tmp_path, image_size=(32, 48))
    assert bigger.loading_report.resampled["embeddings.position_embeddings"] == ((4, 6), (8, 12))


def test_unknown_override_and_other_model_types_are_errors(hf_backbone_dir, tmp_path):
    with pytest.raises(TypeError, match="num_layer"):
        ViTFTModel.from_pretrained(hf_backbone_dir, num_layer=3)
    ViTConfig(**{**tiny_hf_config().to_dict(), "model_type": "deit"}).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((tmp_path / "config.json").read_text().replace('"vit"', '"bert"'))
    with pytest.raises(ValueError, match="model_type 'bert'"):
        ViTFTModel.from_pretrained(tmp_path)


def test_missing_weights_is_transformers_error(tmp_path):
    tiny_hf_config().save_pretrained(tmp_path)
    with pytest.raises(OSError, match="model.safetensors"):
        ViTFTModel.from_pretrained(tmp_path)


def test_missing_keys_follow_transformers_initialised_and_listed(hf_backbone_dir):
    model, info = ViTFTModel.from_pretrained(hf_backbone_dir, num_hidden_layers=3, output_loading_info=True)
    assert info["missing_keys"] and all(k.startswith("layers.2.") for k in info["missing_keys"])
    assert set(model.loading_report.newly_initialized) == info["missing_keys"]
    assert torch.all(model.layers[2].norm1.weight == 1)  # initialised by _init_weights, not left empty


def test_eager_and_sdpa_attention_agree_and_maps_are_returned():
    torch.manual_seed(0)
    model = randomize(ViTFTModel(tiny_ft_config()))
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        fast = model(pixels).last_hidden_state
        eager = model(pixels, output_attentions=True, output_hidden_states=True)
    assert max_diff(fast, eager.last_hidden_state) <= 1e-5
    assert len(eager.attentions) == 2 and eager.attentions[0].shape == (2, 4, 17, 17)
    torch.testing.assert_close(eager.attentions[0].sum(-1), torch.ones(2, 4, 17))
    assert len(eager.hidden_states) == 3


def test_attentions_match_transformers(hf_backbone_dir, reference):
    ours = ViTFTModel.from_pretrained(hf_backbone_dir)
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        expected = reference(pixels, output_attentions=True).attentions
        got = ours(pixels, output_attentions=True).attentions
    for a, b in zip(got, expected, strict=True):
        assert max_diff(a, b) <= 1e-5


def test_mean_pooling():
    model = randomize(ViTFTModel(tiny_ft_config(pooling="mean")))
    out = model(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 1:].mean(1))


@pytest.mark.parametrize(
    ("num_labels", "labels", "problem"),
    [
        (3, torch.tensor([0, 2]), "single"),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), "multi"),
        (1, torch.tensor([0.5, -1.0]), "regression"),
    ],
)
def test_losses_follow_problem_type(num_labels, labels, problem):
    config = tiny_ft_config(num_labels=num_labels)
    model = randomize(ViTFTForImageClassification(config))
    out = model(torch.randn(2, 3, 16, 16), labels=labels)
    if problem == "single":
        expected = torch.nn.functional.cross_entropy(out.logits, labels)
    elif problem == "multi":
        expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels)
    else:
        expected = torch.nn.functional.mse_loss(out.logits.squeeze(-1), labels)
    torch.testing.assert_close(out.loss, expected)


def test_gradient_checkpointing_gives_the_same_gradients():
    config = tiny_ft_config(num_labels=3)
    pixels, labels = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])
    grads = []
    for checkpointing in (False, True):
        model = randomize(ViTFTForImageClassification(config)).train()
        if checkpointing:
            enable_checkpointing(model, use_reentrant=False)
            assert model.vit.layers[0].gradient_checkpointing
        model(pixels, labels=labels).loss.backward()
        grads.append(model.vit.layers[0].attention.qkv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_init_weights_zero_head_and_truncated_normal():
    config = tiny_ft_config(num_labels=4)
    model = ViTFTForImageClassification(config)
    assert torch.count_nonzero(model.classifier.weight) == 0
    weight = model.vit.layers[0].mlp.fc1.weight
    assert abs(weight.std().item() - 0.02) < 0.003 and abs(weight.mean().item()) < 0.003
    assert torch.all(model.vit.layers[0].norm1.weight == 1)
    assert model.no_weight_decay() == {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings"}


@pytest.mark.slow
def test_vit_base_patch16_in21k_config_parity_at_224_and_384(tmp_path_factory):
    """The full ViT-B/16 architecture of google/vit-base-patch16-224-in21k, random weights, fp32."""
    path = tmp_path_factory.mktemp("vit_b16")
    config = ViTConfig()  # defaults are ViT-B/16 at 224, as in the in21k checkpoint
    torch.manual_seed(0)
    ViTModel(config).save_pretrained(path)
    reference = ViTModel.from_pretrained(path).eval()
    for image_size in (224, 384):
        ours = ViTFTModel.from_pretrained(path, image_size=image_size)
        pixels = torch.randn(1, 3, image_size, image_size)
        with torch.no_grad():
            expected = reference(pixels, interpolate_pos_encoding=image_size != 224).last_hidden_state
            assert max_diff(ours(pixels).last_hidden_state, expected) <= 1e-4
        assert ours.config.grid_size == (image_size // 16,) * 2
