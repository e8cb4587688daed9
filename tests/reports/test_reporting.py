"""Tests for vit_ft.reports.reporting: training curves, Markdown and CSV tables."""

import csv

import pytest
from PIL import Image

from vit_ft.reports import reporting
from vit_ft.reports.reporting import (
    KEPT_COLOR,
    NO_LOGS,
    markdown_table,
    plot_training_curves,
    write_csv,
)

HISTORY = [{"step": s, "loss": 2.0 / s, "learning_rate": 1e-3 * s} for s in range(1, 6)] + [
    {"step": s, "eval_loss": 0.5, "eval_accuracy": 0.8, "eval_top5_accuracy": 1.0, "eval_f1": 0.8}
    for s in (5, 10)
]  # accuracy and F1 equal: on one axes with one style, one curve would hide the other


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures plot_training_curves saved, as they were saved (its plt.close is deferred to the end)."""
    saved, close = [], reporting.plt.close
    monkeypatch.setattr(reporting.plt, "close", saved.append)
    yield saved
    for fig in saved:
        close(fig)


def panel_texts(ax) -> str:
    return " ".join(t.get_text() for t in ax.texts)


def test_training_curves_draw_accuracy_and_f1_apart(tmp_path, saved_figures):
    path = plot_training_curves(HISTORY, tmp_path / "curves.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1200, 880)
    (fig,) = saved_figures
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    # equal accuracies: the first is the best; each panel names its own number at the marked steps
    marks = {"best accuracy: step 5, eval loss 0.500", "final: step 10, eval loss 0.500", "best accuracy: step 5",
             "final: step 10", "best accuracy: step 5, top-1 0.800", "final: step 10, top-1 0.800",
             "best accuracy: step 5, macro-F1 0.800", "final: step 10, macro-F1 0.800"}  # fmt: skip
    assert set(lines) == {"train loss", "eval loss", "learning rate", "top-1", "top-5", "macro-F1", *marks}
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "loss", "learning rate", "top-1 / top-5 (evaluation)", "macro-F1 (evaluation)"
    ]
    top1, f1 = lines["top-1"], lines["macro-F1"]
    assert list(top1.get_ydata()) == list(f1.get_ydata())  # the same values ...
    assert top1.axes is not f1.axes and top1.get_marker() != f1.get_marker()  # ... drawn where both show
    assert not any(NO_LOGS in panel_texts(ax) for ax in fig.axes)


def test_training_curves_legends_off_the_data_axes_zoomed_best_and_final_marked(tmp_path, saved_figures):
    history = [{"step": s, "loss": 1.0 / s, "learning_rate": 1e-3} for s in range(1, 31)] + [
        {"step": s, "eval_loss": 0.3 - s / 100, "eval_accuracy": acc, "eval_top5_accuracy": 0.99, "eval_f1": acc - 0.01,
         "eval_runtime": 0.5, "eval_samples_per_second": 288.0}
        for s, acc in ((10, 0.88), (20, 0.98), (30, 0.95))
    ]  # fmt: skip
    plot_training_curves(history, tmp_path / "curves.png", kept_step=30)
    plot_training_curves(
        history, tmp_path / "named.png", evaluated_on="test split, 9 images", best_step=30, kept_step=30
    )
    plot_training_curves(history, tmp_path / "between.png", kept_step=25)
    fig, named, between = saved_figures
    assert (
        fig._suptitle.get_text() == "Training curves; evaluation on validation, 144 images"
    )  # 0.5 s x 288/s
    assert named._suptitle.get_text().endswith("evaluation on test split, 9 images")
    renderer = fig.canvas.get_renderer()
    numbers = ([", eval loss 0.100", ", eval loss 0.000"], ["", ""], [", top-1 0.980", ", top-1 0.950"],
               [", macro-F1 0.970", ", macro-F1 0.940"])  # each panel's own, at steps 20 and 30  # fmt: skip
    for ax, (best, final) in zip(fig.axes, numbers, strict=True):
        marks = {
            line.get_label(): (line.get_xdata()[0], line.get_color())
            for line in ax.get_lines()
            if line.get_label()[:4] in ("best", "fina")
        }
        assert marks == {  # the final model was kept: green
            f"best accuracy: step 20{best}": (20, "0.4"),
            f"final: step 30{final}; kept model": (30, KEPT_COLOR),
        }
        legend, panel = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.y0 >= panel.y1 - 1  # above the panel: on no curve
        assert ax.title.get_window_extent(renderer).y0 >= legend.y1 - 1  # and under the title
    loss, lr, accuracy, f1 = fig.axes
    low, high = accuracy.get_ylim()
    assert 0.8 < low < 0.88 and 0.99 <= high <= 1.01  # zoomed to 0.88..0.99, not 0..1
    assert 0.8 < f1.get_ylim()[0] < 0.87 and f1.get_ylim()[1] < 0.99
    assert {line.get_label() for line in named.axes[2].get_lines()} >= {
        "best accuracy = final: step 30, top-1 0.950; kept model"
    }
    # a kept step that was not evaluated gets a line of its own
    kept = [line for line in between.axes[0].get_lines() if line.get_color() == KEPT_COLOR]
    assert [(line.get_label(), line.get_xdata()[0]) for line in kept] == [
        ("kept model: step 25 (not evaluated)", 25)
    ]


def test_short_run_panels_say_there_are_no_training_logs(tmp_path, saved_figures):
    # max_steps below logging_steps: the Trainer logged the evaluation only
    history = [{"step": 3, "eval_loss": 0.5, "eval_accuracy": 0.8, "eval_top5_accuracy": 1.0, "eval_f1": 0.7}]
    plot_training_curves(history, tmp_path / "short.png")
    plot_training_curves([], tmp_path / "empty.png")
    short, empty = saved_figures
    loss, lr, accuracy, f1 = short.axes
    assert not lr.get_lines() and NO_LOGS in panel_texts(lr)
    mark = "best accuracy = final: step 3, eval loss 0.500"
    assert [line.get_label() for line in loss.get_lines()] == ["eval loss", mark] and NO_LOGS in panel_texts(
        loss
    )
    assert accuracy.get_lines() and f1.get_lines() and NO_LOGS not in panel_texts(accuracy) + panel_texts(f1)
    renderer = short.canvas.get_renderer()
    for ax in (loss, lr):  # the words are inside their panel
        (text,) = ax.texts
        box, words = ax.get_window_extent(renderer), text.get_window_extent(renderer)
        assert box.x0 <= words.x0 and words.x1 <= box.x1 and box.y0 <= words.y0 and words.y1 <= box.y1
    assert all(not ax.get_lines() and NO_LOGS in panel_texts(ax) for ax in empty.axes)


def test_markdown_table_escapes_pipes_and_rounds_floats():
    rows = [{"class": "cat|dog", "f1": 0.123456, "support": 3}]
    assert markdown_table(rows, ["class", "f1", "support"]) == (
        "| class | f1 | support |\n| --- | --- | --- |\n| cat\\|dog | 0.1235 | 3 |\n"
    )


def test_write_csv_round_trip(tmp_path):
    rows = [
        {"path": "a, b.png", "label": "cat", "score": 0.25},
        {"path": 'q"uote.png', "label": "dog", "score": 1.0},
    ]
    with write_csv(tmp_path / "rows.csv", rows).open(newline="", encoding="utf-8") as f:
        assert list(csv.DictReader(f)) == [{k: str(v) for k, v in row.items()} for row in rows]
    assert write_csv(tmp_path / "empty.csv", []).read_text().strip() == "empty"
