"""vit_ft.training.ema against timm's ModelEmaV3 (its formulas, transcribed: timm is not installed here)."""

import pytest
import torch

from vit_ft import ViTFTForImageClassification
from vit_ft.training.ema import EMA_FILE, WeightEMA, ema_decay_at

from ..conftest import tiny_ft_config


def timm_get_decay(
    step: int, decay: float, use_warmup: bool, gamma: float = 1.0, power: float = 2 / 3
) -> float:
    """timm.utils.model_ema.ModelEmaV3.get_decay (update_after_step=0, min_decay=0), as written there."""
    step = max(0, step - 0 - 1)
    if step <= 0:
        return 0.0
    if use_warmup:
        value = 1 - (1 + step / gamma) ** -power
        return max(min(value, decay), 0.0)
    return decay


@pytest.mark.parametrize("warmup", [False, True])
def test_decay_schedule_is_timms(warmup):
    for step in (0, 1, 2, 3, 10, 100, 10_000):
        assert ema_decay_at(step, 0.999, warmup) == timm_get_decay(step, 0.999, warmup)
    assert ema_decay_at(1, 0.999, warmup) == 0.0  # the first update copies the weights


def _perturb(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator))


def test_updates_follow_the_lerp_and_survive_a_save(tmp_path):
    model = ViTFTForImageClassification(tiny_ft_config(num_labels=3))
    model.vit.embeddings.cls_token.requires_grad_(False)  # frozen: not averaged
    ema = WeightEMA(model, decay=0.9, warmup=True)
    expected = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert set(ema.shadow) == set(expected)
    for step in range(1, 6):
        _perturb(model, step)
        ema.update(model, step)
        decay = timm_get_decay(step, 0.9, True)
        params = dict(model.named_parameters())
        expected = {n: decay * e + (1 - decay) * params[n].detach() for n, e in expected.items()}
    for name, value in expected.items():
        assert torch.allclose(ema.shadow[name], value, atol=1e-6), name
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ema.applied_to(model):
        assert torch.equal(model.classifier.weight, ema.shadow["classifier.weight"])
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())  # restored
    ema.save(tmp_path / EMA_FILE)
    other = WeightEMA(model, decay=0.9)
    other.load(tmp_path / EMA_FILE)
    assert all(torch.equal(other.shadow[n], v) for n, v in ema.shadow.items())  # bit for bit
    with pytest.raises(ValueError, match="written without ema_decay"):
        other.load(tmp_path / "none" / EMA_FILE)
