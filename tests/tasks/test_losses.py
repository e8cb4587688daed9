"""vit_ft.tasks.losses and sampler: the loss against torch's cross_entropy and timm's SoftTargetCrossEntropy,
class weights against scikit-learn, the balanced sampler's determinism, and minority recall on skewed data."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.utils.class_weight import compute_class_weight

from vit_ft.tasks.losses import ClassificationLoss, balanced_class_weights, class_weight_vector
from vit_ft.training.sampler import ClassBalancedSampler


def _batch(seed: int = 0, batch: int = 12, classes: int = 5):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, classes, generator=generator) * 3
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return {"logits": logits}, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_hard_labels_are_torch_cross_entropy(smoothing, weighted):
    outputs, labels = _batch()
    weight = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0]) if weighted else None
    loss = ClassificationLoss(weight, smoothing)(outputs, labels, num_items_in_batch=99)
    expected = F.cross_entropy(outputs["logits"], labels, weight=weight, label_smoothing=smoothing)
    assert torch.allclose(loss, expected)
    if weighted:  # and not the unweighted value (the weights reach the loss)
        assert not torch.allclose(loss, F.cross_entropy(outputs["logits"], labels, label_smoothing=smoothing))


def test_soft_targets_are_timm_soft_target_cross_entropy():
    outputs, labels = _batch(1)
    lam = 0.7
    targets = F.one_hot(labels, 5).float() * lam + F.one_hot(labels.flip(0), 5).float() * (1 - lam)
    # timm.loss.SoftTargetCrossEntropy: sum(-target * log_softmax(x)).mean()
    timm = torch.sum(-targets * F.log_softmax(outputs["logits"], dim=-1), dim=-1).mean()
    loss = ClassificationLoss(label_smoothing=0.1)(outputs, targets)  # smoothing is in the targets already
    assert torch.allclose(loss, timm)
    weight = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0])
    weighted = ClassificationLoss(weight)(outputs, targets)
    assert torch.allclose(weighted, F.cross_entropy(outputs["logits"], targets, weight=weight))
    expected = torch.sum(-targets * weight * F.log_softmax(outputs["logits"], dim=-1), dim=-1).mean()
    assert torch.allclose(weighted, expected)


def test_balanced_weights_are_sklearns():
    labels = [0] * 50 + [1] * 7 + [2] * 3
    ours = balanced_class_weights(labels, 3)
    assert np.allclose(ours, compute_class_weight("balanced", classes=np.arange(3), y=np.array(labels)))
    names = ["cat", "dog", "0"]
    assert torch.allclose(
        class_weight_vector("balanced", names, labels), torch.tensor(ours, dtype=torch.float32)
    )
    assert class_weight_vector({"dog": 2.5, "0": 3}, names, labels).tolist() == [1.0, 2.5, 3.0]
    with pytest.raises(ValueError, match=r"\['cow'\] which are not classes.*cat, dog, 0"):
        class_weight_vector({"cow": 2.0}, names, labels)


def test_balanced_sampler_is_a_function_of_seed_and_epoch_and_balances():
    labels = [0] * 90 + [1] * 10
    sampler = ClassBalancedSampler(labels, seed=3)
    first = list(sampler)
    assert len(first) == len(sampler) == 100 and list(sampler) == first  # same epoch: same order
    again = ClassBalancedSampler(labels, seed=3)
    again.set_epoch(1)
    sampler.set_epoch(1)
    assert list(again) == list(sampler) != first  # another epoch: another order, the same in a new process
    many = np.array(labels * 50)
    draws = many[np.array(list(ClassBalancedSampler(many.tolist(), seed=0)))]
    assert abs(draws.mean() - 0.5) < 0.03  # the minority class drawn half the time, not 10 %
