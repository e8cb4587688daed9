"""vit_ft.reports.fewshot: the results table of a few-shot record."""

import pytest

from vit_ft.reports.fewshot import results_table


def test_results_table_shows_mean_std_each_seed_and_the_chosen_l2():
    results = [
        {
            "shots": 1,
            "mean_accuracy": 0.5,
            "std_accuracy": 0.1,
            "accuracies": [0.4, 0.6],
            "l2": [1024.0, 0.25],
        },
        {"shots": 5, "mean_accuracy": 0.9, "std_accuracy": 0.0, "accuracies": [0.9], "l2": [1.0]},
    ]
    lines = results_table(results).splitlines()
    results[0]["knn_mean_accuracy"] = 0.45  # the kNN evaluator's column; a record without it shows "-"
    lines = results_table(results).splitlines()
    assert lines[0] == (
        "| shots per class | accuracy (mean ± std over seeds) | per seed | chosen l2 | kNN accuracy (mean) |"
    )
    assert lines[2:] == [
        "| 1 | 50.0 % ± 10.0 | 40.0, 60.0 | 2^10, 2^-2 | 45.0 % |",
        "| 5 | 90.0 % ± 0.0 | 90.0 | 2^0 | - |",
    ]


GRID = [2.0**k for k in range(-10, 21, 2)]
EDGE_RESULTS = [  # as the digits checkpoint measured: most draws at the top of the grid
    {"shots": 1, "mean_accuracy": 0.949, "std_accuracy": 0.007, "accuracies": [0.956, 0.95, 0.942],
     "l2": [2.0**12, 2.0**6, 2.0**20]},
    {"shots": 10, "mean_accuracy": 0.971, "std_accuracy": 0.002, "accuracies": [0.972, 0.969, 0.972],
     "l2": [2.0**20, 1.0, 2.0**-10]},
]  # fmt: skip


def test_l2_chosen_at_the_edge_of_its_grid_is_flagged_in_the_table_and_the_note():
    from vit_ft.reports.fewshot import edge_choices, edge_note

    assert edge_choices(EDGE_RESULTS, GRID) == (3, 6)  # 2^20 twice and 2^-10 once
    assert edge_choices(EDGE_RESULTS, [1.0]) == (0, 6)  # one value: nothing was chosen
    lines = results_table(EDGE_RESULTS, GRID).splitlines()
    assert lines[2].endswith("| 2^12, 2^6, 2^20* | - |") and lines[3].endswith("| 2^20*, 2^0, 2^-10* | - |")
    assert edge_note(EDGE_RESULTS, GRID).startswith("3 of 6 draws chose the l2 at the edge of its search range")
    assert edge_note(EDGE_RESULTS[:1], [2.0**k for k in range(-10, 31, 2)]) == ""


def test_fewshot_figure_is_zoomed_with_chance_named_and_edge_choices_ringed(tmp_path, monkeypatch):
    from vit_ft.reports import fewshot

    saved, close = [], fewshot.plt.close
    monkeypatch.setattr(fewshot.plt, "close", saved.append)
    try:
        fewshot.plot_fewshot(EDGE_RESULTS, tmp_path / "zoomed.png", "digits", num_classes=10, l2_grid=GRID)
        random = [dict(r, mean_accuracy=a, std_accuracy=0.05, l2=[1.0])
                  for r, a in zip(EDGE_RESULTS, (0.25, 0.7), strict=True)]  # fmt: skip
        fewshot.plot_fewshot(random, tmp_path / "whole.png", "random init", num_classes=10, l2_grid=GRID)
        zoomed, whole = (figure.axes[0] for figure in saved)
        assert zoomed.get_ylim() == pytest.approx((90, 100.5))  # 94-97 % fills the axis, not 0-100
        assert "axis from 90 %, not 0; chance (10.0 %) below it" in [t.get_text() for t in zoomed.texts]
        assert "3 of 6 draws chose l2 at the edge of its search range" in zoomed.get_title()
        (rings,) = [line for line in zoomed.get_lines() if line.get_label().startswith("l2 chosen at the edge")]
        assert list(rings.get_xdata()) == [1, 10]
        assert whole.get_ylim()[0] == 0 and not whole.texts
        (chance,) = [line for line in whole.get_lines() if line.get_label() == "chance (10.0 %)"]
        assert list(chance.get_ydata()) == [10, 10]
        assert "edge" not in whole.get_title()
    finally:
        for figure in saved:
            close(figure)
