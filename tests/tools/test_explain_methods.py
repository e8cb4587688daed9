"""vit_ft.tools.explain.methods against their references: Chefer et al.'s relevance loop and pytorch-grad-cam's
ViT Grad-CAM run on transformers' own ViT (the same weights), captum's completeness and a hand-made occlusion;
every prefix-token layout, rotary positions, any resolution and NaFlex batches."""

import pytest
import torch

from vit_ft import ViTFTForImageClassification
from vit_ft.tools.explain.methods import CLASS_SPECIFIC, METHODS, check_method, explain, patch_grids

from ..conftest import randomize, tiny_ft_config

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

pytest.importorskip("captum")


def _classifier(seed=0, **overrides):
    return randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3, **overrides)), seed)


@pytest.fixture(scope="module")
def pair(hf_classifier_dir):
    """transformers' ViTForImageClassification (eager attention) and ours, loaded from the same checkpoint."""
    from transformers import ViTForImageClassification

    theirs = ViTForImageClassification.from_pretrained(hf_classifier_dir, attn_implementation="eager").eval()
    ours = ViTFTForImageClassification.from_pretrained(hf_classifier_dir).eval()
    return theirs, ours


def _chefer_reference(model, pixels, index):
    """The notebook `Transformer_MM_explainability_ViT.ipynb`'s `generate_relevance` (one image), on transformers'
    ViT: rule 5 (`avg_heads`) and rule 6 (`apply_self_attention_rules`), the CLS row over the patches."""
    out = model(pixel_values=pixels, output_attentions=True)
    grads = torch.autograd.grad(out.logits[0, index], out.attentions)
    tokens = out.attentions[0].shape[-1]
    relevance = torch.eye(tokens)
    for cam, grad in zip(out.attentions, grads, strict=True):
        cam = (grad[0] * cam[0]).clamp(min=0).mean(dim=0)
        relevance = relevance + cam @ relevance
    return relevance[0, 1:]


def _gradcam_reference(model, pixels, index):
    """pytorch-grad-cam's GradCAM on `vit.layers[-1].layernorm_before` with its ViT reshape transform
    (CLS dropped, tokens to a grid): weights = mean gradient per channel, relu of the weighted sum."""
    captured = []
    layer = model.vit.layers[-1].layernorm_before
    hook = layer.register_forward_hook(lambda m, a, o: captured.append(o))
    logits = model(pixel_values=pixels).logits
    hook.remove()
    (grad,) = torch.autograd.grad(logits[0, index], captured[0])
    acts, grad = captured[0][0, 1:], grad[0, 1:]  # (N, hidden)
    return torch.relu((grad.mean(dim=0) * acts).sum(-1))


@pytest.mark.parametrize("index", [0, 2])
def test_methods_match_their_references_on_transformers_vit(pair, index):
    theirs, ours = pair
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(index))
    rollout = explain(ours, pixels, "grad_rollout", target=index)
    cam = explain(ours, pixels, "gradcam", target=index)
    for i in range(2):
        torch.testing.assert_close(rollout[i], _chefer_reference(theirs, pixels[i : i + 1], index), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(cam[i], _gradcam_reference(theirs, pixels[i : i + 1], index), atol=1e-5, rtol=1e-4)


def test_integrated_gradients_are_complete_and_occlusion_is_the_logit_drop():
    model = _classifier()
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits[0]
        baseline = model(pixel_values=torch.zeros_like(pixels)).logits[0]
    ig = explain(model, pixels, "integrated_gradients", target=1)
    # completeness (Sundararajan et al. 2017): the attributions sum to f(x) - f(baseline)
    assert float(ig.sum()) == pytest.approx(float(logits[1] - baseline[1]), rel=0.05, abs=1e-3)
    occluded = explain(model, pixels, "occlusion", target=1)
    expected = []
    for row in range(4):
        for col in range(4):
            hidden = pixels.clone()
            hidden[..., 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] = 0
            with torch.no_grad():
                expected.append(logits[1] - model(pixel_values=hidden).logits[0, 1])
    torch.testing.assert_close(occluded[0], torch.stack(expected), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides",
    [
        {"distillation_token": True, "num_register_tokens": 2},
        {"class_token": False, "pooling": "mean"},
        {"class_token": False, "pooling": "map"},
        {"rope_theta": 100.0, "num_register_tokens": 1},
    ],
    ids=["deit-registers", "mean", "map", "rope"],
)
def test_every_method_runs_for_every_prefix_layout_at_another_resolution(overrides):
    model = _classifier(**overrides)
    pixels = torch.randn(2, 3, 12, 20, generator=torch.Generator().manual_seed(0))  # not the config's 16 x 16
    for method in METHODS:
        maps = explain(model, pixels, method, target=[0, 2])
        assert maps.shape == (2, 15) and torch.isfinite(maps).all() and maps.abs().sum() > 0, method
        assert [g.shape for g in patch_grids(maps, pixels, (4, 4))] == [(3, 5), (3, 5)]


def test_naflex_maps_ignore_the_padding():
    """An image's map in a padded NaFlex batch is its map alone; the padding's entries are 0."""
    from vit_ft.data.naflex import collate_patches, to_patches

    model = _classifier(max_num_patches=16)
    generator = torch.Generator().manual_seed(3)
    small, large = torch.randn(3, 8, 12, generator=generator), torch.randn(3, 12, 16, generator=generator)
    patches = [to_patches(image, 4) for image in (small, large)]
    both = collate_patches([p.flatten(0, 1) for p in patches], [p.shape[:2] for p in patches])
    alone = collate_patches([patches[0].flatten(0, 1)], [patches[0].shape[:2]])
    for method in METHODS:
        padded, single = explain(model, both, method, target=1), explain(model, alone, method, target=1)
        torch.testing.assert_close(padded[0, :6], single[0], atol=1e-4, rtol=1e-3, msg=method)
        assert padded[0, 6:].abs().sum() == 0, method
        assert [tuple(g.shape) for g in patch_grids(padded, both, (4, 4))] == [(2, 3), (3, 4)]


def test_class_specific_maps_depend_on_the_target_and_rollout_does_not():
    model = _classifier()
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    for method in METHODS:
        first, second = explain(model, pixels, method, target=0), explain(model, pixels, method, target=2)
        assert torch.equal(first, second) == (method not in CLASS_SPECIFIC), method
    predicted = int(model(pixel_values=pixels).logits.argmax())
    torch.testing.assert_close(explain(model, pixels, "gradcam"), explain(model, pixels, "gradcam", target=predicted))


def test_bad_method_target_or_model_is_one_clear_error():
    model = _classifier()
    pixels = torch.zeros(1, 3, 16, 16)
    with pytest.raises(ValueError, match="not a method: choose one of grad_rollout"):
        explain(model, pixels, "saliency")
    with pytest.raises(ValueError, match=r"target class 3 does not exist: this model has classes 0\.\.2"):
        explain(model, pixels, "gradcam", target=3)
    with pytest.raises(ValueError, match="needs a vit_ft classifier"):
        check_method("gradcam", torch.nn.Linear(2, 2))
