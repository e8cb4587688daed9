"""The method-cost benchmark (`benchmarks.peft_costs`) on a tiny ViT: one row per method, each trainable count
what peft (or, for SSF and VPT, our model's own modules) reports for that method, and LoRA the reference."""

from __future__ import annotations

import pytest

from benchmarks.common import quick_settings
from benchmarks.peft_costs import COST_METHODS, main, measure_costs, method_models, to_markdown
from vit_ft.training.ssf import ScaleShift


def _reported_trainable(model, method: str) -> int:
    """The trainable count from the method's own implementation, not from counting requires_grad."""
    head = sum(p.numel() for p in model.classifier.parameters()) if method in ("ssf", "vpt", "full") else 0
    if method == "full":
        return sum(p.numel() for p in model.parameters())
    if method == "ssf":  # a scale and a shift per output of every wrapped op
        return head + sum(m.scale.numel() + m.shift.numel() for m in model.modules() if isinstance(m, ScaleShift))
    if method == "vpt":
        return head + model.vit.prompts.tokens.numel()
    return model.get_nb_trainable_parameters()[0]  # peft's count (adapters and modules_to_save)


def test_each_method_row_counts_what_its_implementation_reports():
    settings = quick_settings(rounds=1, warmup=0, measure_memory=False)
    models = method_models(settings)
    costs = measure_costs(settings, models=models)
    assert [c.method for c in costs] == list(COST_METHODS)
    for cost in costs:
        assert cost.trainable == _reported_trainable(models[cost.method], cost.method), cost.method
        assert 0 < cost.trainable <= cost.total
        assert len(cost.step_s) == 1 and cost.step_s[0] > 0
    full = next(c for c in costs if c.method == "full")
    assert all(c.trainable < full.trainable for c in costs if c is not full)
    table = to_markdown(costs).splitlines()
    assert len(table) == 2 + len(COST_METHODS)
    assert table[2].startswith("| lora |") and "| 1.00 (1.00-1.00) |" in table[2]


def test_unknown_method_or_no_reference_is_a_usage_error(capsys):
    for methods in ("lora,prefix", "dora,ssf"):
        with pytest.raises(SystemExit) as raised:
            main(["--methods", methods, "--quick"])
        assert raised.value.code == 2
        assert "lora among them" in capsys.readouterr().err
