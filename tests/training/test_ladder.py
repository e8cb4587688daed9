"""`method: auto`: when the ladder climbs (a table of gains and budgets), and one ladder end to end on the real
digits with an injected clock (never wall time): the rungs' folders, the winner copied into the output folder
as a model the tools load, report.md's table."""

from __future__ import annotations

import json

import pytest

from vit_ft.arguments.recipes import build_plan
from vit_ft.tools.trained import load_trained
from vit_ft.training.ladder import RUNGS, Rung, next_rung_reason, run_ladder
from vit_ft.training.stages import run_finetune

from ..conftest import write_tiny_recipe


@pytest.mark.parametrize(
    ("validations", "min_gain", "spent", "budget", "stops"),
    [
        ([0.50], 1.0, 0.0, None, ""),  # kNN always leads on to the linear probe
        ([0.50, 0.60], 1.0, 0.0, None, ""),  # +10 points: on to LoRA
        ([0.50, 0.505], 1.0, 0.0, None, "gained +0.50 points"),  # half a point is not above one
        ([0.50, 0.51], 1.0, 0.0, None, "gained +1.00 points"),  # exactly the threshold: not above it
        ([0.60, 0.50, 0.62], 1.0, 0.0, None, ""),  # the gain is over the best below (0.60): +2 > 1
        ([0.60, 0.70, 0.62], 1.0, 0.0, None, "gained -8.00 points"),  # below the best rung: stop
        ([0.50, 0.60], 1.0, 600.0, 10.0, "budget of 10 minutes was spent"),
        ([0.50, 0.60], 1.0, 599.0, 10.0, ""),
        ([None], 1.0, 0.0, None, "no validation metric"),
    ],
)
def test_when_the_ladder_climbs(validations, min_gain, spent, budget, stops):
    rungs = [Rung(method, True, value) for method, value in zip(RUNGS, validations, strict=False)]
    why = next_rung_reason(rungs, min_gain, spent, budget)
    assert (stops in why) if stops else why == ""


class FakeClock:
    """Ten seconds pass at each reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


@pytest.mark.slow
def test_ladder_end_to_end_with_an_injected_clock(tmp_path):
    recipe = write_tiny_recipe(tmp_path, num_train_epochs=1, max_train_samples=60, max_eval_samples=30)
    plan = build_plan(
        ["--recipe", str(recipe), "--method", "auto", "--budget_minutes", "1", "--ladder_min_gain", "0"]
    )
    model_args, _, training_args = plan.arguments
    # readings: start 10; kNN 20-30; linear's check 40 (< 60 s: on), 50-60; LoRA's check 70 >= 60: stop
    rung = lambda rung_model, rung_training: run_finetune(plan.with_arguments(rung_model, rung_training))  # noqa: E731
    metrics = run_ladder(model_args, training_args, rung, clock=FakeClock())
    out = tmp_path / "out"
    record = json.loads((out / "ladder.json").read_text())
    ran = [rung["method"] for rung in record["rungs"] if rung["ran"]]
    assert ran == ["knn", "linear"] and [r["method"] for r in record["rungs"]] == ["knn", "linear", "lora", "full"]
    lora = record["rungs"][2]
    assert "budget of 1 minutes was spent" in lora["why"] or "not above ladder_min_gain" in lora["why"]
    assert all(rung["seconds"] == 10.0 for rung in record["rungs"][:2])  # the injected clock's time, not wall time
    best = max(record["rungs"][:2], key=lambda r: r["validation"])
    assert record["kept"] == best["method"] and metrics["eval_accuracy"] == best["validation"]
    for method in ran:
        assert json.loads((out / "ladder" / method / "vit_ft_run.json").read_text())["method"] == method
    # the winner is the output folder's model, loadable by the tools
    trained = load_trained(str(out))
    assert trained.model.config.head_type == ("knn" if best["method"] == "knn" else "linear")
    report = (out / "report.md").read_text()
    assert "| knn | yes |" in report and "| lora | no |" in report and f"{100 * best['validation']:.2f}" in report
