"""vit_ft.reports.fewshot: the results table of a few-shot record."""

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
    assert lines[0] == "| shots per class | accuracy (mean ± std over seeds) | per seed | chosen l2 |"
    assert lines[2:] == [
        "| 1 | 50.0 % ± 10.0 | 40.0, 60.0 | 2^10, 2^-2 |",
        "| 5 | 90.0 % ± 0.0 | 90.0 | 2^0 |",
    ]
