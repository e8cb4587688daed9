"""vit_ft.tools.explain.faithfulness: deletion / insertion curves against images perturbed by hand, the AUC
against numpy's trapezoid rule, the randomised copy, and Spearman's correlation against scipy's."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from vit_ft import ViTFTForImageClassification
from vit_ft.tools.explain.faithfulness import (
    cascading_randomization,
    curve_auc,
    perturbation_curves,
    random_maps,
    randomized_copy,
    spearman,
)
from vit_ft.tools.explain.methods import explain

from ..conftest import randomize, tiny_ft_config


def _model(**overrides):
    return randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3, **overrides)))


def _by_hand(model, pixels, order, kept, target):
    """The target's softmax probability with only the patches `kept` of `order` (the rest mean-filled)."""
    image = pixels.clone()
    mean = pixels.mean(dim=(2, 3), keepdim=True)
    for index in order[kept:] if kept is not None else order:
        row, col = divmod(int(index), 4)
        image[..., 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] = mean[..., 0, 0, None, None]
    with torch.no_grad():
        return float(torch.softmax(model(pixel_values=image).logits, -1)[0, target])


def test_curves_are_the_probabilities_of_the_perturbed_images():
    model = _model()
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    maps = torch.randn(1, 16, generator=torch.Generator().manual_seed(1))
    order = torch.argsort(maps[0], descending=True).tolist()
    deletion = perturbation_curves(model, pixels, maps, 2, "deletion", steps=4)[0]
    insertion = perturbation_curves(model, pixels, maps, 2, "insertion", steps=4)[0]
    # step k of 4 removes (or inserts) the first 4k patches of the map's order
    for step in range(5):
        removed = order[: 4 * step]
        kept_after_deletion = [i for i in range(16) if i not in removed]
        expected = _by_hand(model, pixels, [i for i in range(16) if i in removed], 0, 2)
        assert deletion[step] == pytest.approx(expected, abs=1e-5)
        inserted = _by_hand(model, pixels, kept_after_deletion, 0, 2)
        assert insertion[step] == pytest.approx(inserted, abs=1e-5)
    torch.testing.assert_close(curve_auc(deletion[None]), torch.tensor([np.trapezoid(deletion.numpy(), dx=0.25)]))


def test_a_multi_label_curve_reads_the_sigmoid_and_naflex_padding_is_no_patch():
    from vit_ft.data.naflex import collate_patches, to_patches

    model = _model(problem_type="multi_label_classification", max_num_patches=16)
    image = torch.randn(3, 8, 12, generator=torch.Generator().manual_seed(2))
    patches = to_patches(image, 4)
    alone = collate_patches([patches.flatten(0, 1)], [patches.shape[:2]])
    padded = collate_patches([patches.flatten(0, 1)], [patches.shape[:2]], length=10)
    maps = torch.arange(10, dtype=torch.float32)[None]
    curve = perturbation_curves(model, alone, maps[:, :6], 1, steps=3)
    torch.testing.assert_close(perturbation_curves(model, padded, maps, 1, steps=3), curve, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        start = torch.sigmoid(model(**alone).logits)[0, 1]
    assert float(curve[0, 0]) == pytest.approx(float(start), abs=1e-6)


def test_randomized_copy_changes_the_top_blocks_and_head_only():
    model = _model(num_hidden_layers=3)
    copied = randomized_copy(model, top_blocks=1)
    before, after = dict(model.named_parameters()), dict(copied.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(name.startswith(("vit.layers.2.", "classifier.")) for name in changed)
    assert copied.classifier.weight.abs().sum() > 0  # drawn, not zeroed: gradients still flow


def test_spearman_and_random_maps():
    generator = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, 20, generator=generator), torch.randn(3, 20, generator=generator)
    expected = [spearmanr(x, y).statistic for x, y in zip(a.numpy(), b.numpy(), strict=True)]
    torch.testing.assert_close(spearman(a, b), torch.tensor(expected, dtype=torch.float32))
    assert spearman(a, torch.zeros_like(a)).abs().sum() == 0  # a constant map correlates with nothing
    assert random_maps(a).shape == a.shape and not torch.equal(random_maps(a, 0), random_maps(a, 1))


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")  # the constant maps below, on purpose
def test_cascading_randomization_goes_from_the_head_down_every_block():
    """Each step's correlation is scipy's over the maps of the copy with the head and the top k blocks drawn anew;
    rollout, blind to the head, keeps 1.0 at the first step, a gradient method does not."""
    model = _model(num_hidden_layers=3)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    rows = cascading_randomization(model, pixels, "gradcam", [0, 2], seed=1)
    assert [row["randomised"] for row in rows] == ["head", "head + top 1 block", "head + top 2 blocks", "head + top 3 blocks"]
    trained = explain(model, pixels, "gradcam", target=[0, 2]).numpy()
    for row in rows:
        drawn = explain(randomized_copy(model, top_blocks=row["blocks"], seed=1), pixels, "gradcam", target=[0, 2]).numpy()
        # a constant map (Grad-CAM's relu can zero every patch) ranks nothing: 0, where scipy says nan
        expected = np.mean([np.nan_to_num(spearmanr(a, b).statistic) for a, b in zip(trained, drawn, strict=True)])
        assert row["spearman"] == pytest.approx(expected, abs=1e-6)
    assert rows[0]["spearman"] < 0.99
    rollout = cascading_randomization(model, pixels, "rollout", [0, 2])
    assert rollout[0]["spearman"] == pytest.approx(1.0) and rollout[-1]["spearman"] < 0.99
