"""Tests for vit_ft.reports.robustness: the shift figure's legend clear of its bars, and the shift section of a model
card read from an evaluation's metrics.json (`evaluation_shift`), with its refusals."""

import json

import pytest

from vit_ft.reports.robustness import evaluation_shift, shift_card_lines, write_shift_table
from vit_ft.tasks.card import model_card

SHIFT = {
    "kind": "corruptions", "clean": 0.9,
    "rows": [{"shift": name, "family": family, "severity 1": a1, "severity 2": a2, "severity 3": a3,
              "accuracy": (a1 + a2 + a3) / 3, "relative error": (1 - (a1 + a2 + a3) / 3) - 0.1}
             for name, family, a1, a2, a3 in (("gaussian_noise", "noise", 0.8, 0.6, 0.4),
                                              ("contrast", "photometric", 1.0, 1.0, 1.0))],
    "how": "9 ImageNet-C corruptions (noise, blur, photometric, digital) at severities 1, 3 and 5 of five, seed 7, 20 "
           "images.",
}  # fmt: skip
SHIFT["mean_accuracy"] = (SHIFT["rows"][0]["accuracy"] + SHIFT["rows"][1]["accuracy"]) / 2
SHIFT["relative_error"] = (1 - SHIFT["mean_accuracy"]) - 0.1


def test_the_legend_clears_every_bar_even_at_full_height(tmp_path, saved_figures):
    write_shift_table(tmp_path, SHIFT)  # the last bar at 100 %: the old legend (lower right) sat on it
    (figure,) = saved_figures
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    (axis,) = figure.axes
    legend = axis.get_legend().get_window_extent(renderer)
    bars = [bar.get_window_extent(renderer) for bar in axis.patches]
    assert len(bars) == 2 and not any(legend.overlaps(bar) for bar in bars)
    assert not legend.overlaps(axis.title.get_window_extent(renderer))
    assert (tmp_path / "shift.png").is_file()


def test_the_card_shows_clean_against_shifted_accuracy_with_seed_and_severities(tmp_path):
    run = {"recipe": "digits", "base_model": "outputs/digits-pretrained", "image_size": [32, 32], "lora": False,
           "data": {"builtin_dataset": "digits"}, "metrics": {"test_accuracy": 0.9}}  # fmt: skip
    card = str(model_card(run, "digits", tmp_path, shift=(SHIFT, "split 'test' of data/digits/test")))
    section = card[card.index("## Robustness under shift"):card.index("## Use")]
    mean = 100 * SHIFT["mean_accuracy"]
    assert "split 'test' of data/digits/test" in section and "Clean accuracy 90.00 %" in section
    assert f"mean shifted accuracy {mean:.2f} %" in section
    assert f"relative error (the mean shifted error minus the clean error, Hendrycks & Dietterich's numerator) " \
           f"{100 * SHIFT['relative_error']:.2f} points" in section  # fmt: skip
    assert "seed 7" in section and "severities 1, 3 and 5 of five" in section
    assert "| gaussian_noise | noise | 0.8000 | 0.6000 | 0.4000 | 0.6000 | 0.3000 |" in section, section
    assert "## Robustness under shift" not in str(model_card(run, "digits", tmp_path))  # no evaluation, no section
    assert shift_card_lines(SHIFT, "x")[0] == "## Robustness under shift"


def test_an_evaluation_without_a_shift_or_of_another_model_is_refused(tmp_path):
    model, other = tmp_path / "model", tmp_path / "other"
    model.mkdir()
    other.mkdir()
    with pytest.raises(FileNotFoundError, match="no metrics.json there"):
        evaluation_shift(tmp_path / "report", model)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "metrics.json").write_text(json.dumps({"model": str(model), "accuracy": 0.9}))
    with pytest.raises(ValueError, match="evaluated without --shift; run `vit-ft evaluate"):
        evaluation_shift(tmp_path / "report", model)
    metrics = {"model": str(other), "data": "split 'test'", "shift": SHIFT}
    (tmp_path / "report" / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ValueError, match="evaluated .*other, not .*model"):
        evaluation_shift(tmp_path / "report", model)
    assert evaluation_shift(tmp_path / "report", other) == (SHIFT, "split 'test'")
