"""vit_ft.training.sweep_results: the winner chosen on validation (never on test), ties broken on validation loss."""

import math

import pytest

from vit_ft.training.sweep_results import choose, summarize
from vit_ft.training.sweep_values import sweep_runs
from vit_ft.utils.run_record import write_run_record

from ..conftest import write_tiny_recipe


def test_choose_takes_the_best_score_and_breaks_ties_on_validation_loss():
    assert choose([0.5, 0.9, 0.7], greater_is_better=True) == 1
    assert choose([0.5, 0.9, 0.7], greater_is_better=False) == 0
    assert choose([0.9, 0.9], True, losses=[0.4, 0.3]) == 1  # same accuracy, lower loss
    assert choose([0.9, 0.9], True, losses=[0.3, 0.3]) == 0  # a full tie goes to the earlier value
    assert choose([math.nan, 0.1, None], True) == 1  # a run without a score never wins
    with pytest.raises(ValueError, match="no run of the sweep has a validation score"):
        choose([None, math.nan], True)


def test_summary_chooses_on_validation_not_on_test(tmp_path):
    recipe = write_tiny_recipe(tmp_path)  # parsed only: nothing trains here
    runs = sweep_runs(["--recipe", str(recipe)], "learning_rate", ["0.001", "0.01", "0.1"], tmp_path / "out")
    assert [run.plan.training_args.learning_rate for run in runs] == [0.001, 0.01, 0.1]
    validation, test = [0.50, 0.80, 0.70], [0.90, 0.60, 0.95]  # the test split would choose otherwise
    for run, eval_accuracy, test_accuracy in zip(runs, validation, test, strict=True):
        run.folder.mkdir(parents=True)
        write_run_record(
            run.folder, {"metrics": {"eval_accuracy": eval_accuracy, "test_accuracy": test_accuracy}}
        )
    summary = summarize("learning_rate", runs, runs[0].plan.training_args)
    assert summary["metric"] == "eval_accuracy" and summary["greater_is_better"] is True
    assert summary["chosen"] == {"value": 0.01, "text": "0.01", "folder": "sweep-learning_rate-0.01"}
    assert [row["test_accuracy"] for row in summary["runs"]] == test
    assert [row["chosen"] for row in summary["runs"]] == [False, True, False]
