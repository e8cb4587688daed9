"""Tests for vit_ft.reports.reporting: training curves, the model card, Markdown and CSV tables, the report."""

import csv
import re

import pytest
import yaml
from PIL import Image

from vit_ft.reports import reporting
from vit_ft.reports.reporting import (
    NO_LOGS,
    PER_CLASS_COLUMNS,
    markdown_table,
    plot_training_curves,
    write_csv,
    write_report_lines,
)
from vit_ft.tasks import SingleLabel
from vit_ft.tasks.card import model_card, write_model_card

RUN = {
    "recipe": "beans",
    "base_model": "google/vit-base-patch16-224-in21k",
    "image_size": [224, 224],
    "lora": False,
    "data": {"dataset_name": "AI-Lab-Makerere/beans"},
    "metrics": {"eval_accuracy": 0.9, "eval_f1": 0.88, "test_accuracy": 0.95, "test_top5_accuracy": 1.0,
                "test_f1": 0.94, "test_loss": 0.2, "test_runtime": 3.0},
}  # fmt: skip


def front_matter(text: str) -> tuple[dict, str]:
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


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
    marks = {"best: step 5, accuracy 0.800", "final: step 10, accuracy 0.800"}  # equal accuracies: the first
    assert set(lines) == {"train loss", "eval loss", "learning rate", "top-1", "top-5", "macro-F1", *marks}
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
    plot_training_curves(history, tmp_path / "curves.png")
    plot_training_curves(history, tmp_path / "named.png", evaluated_on="test split, 9 images", best_step=30)
    fig, named = saved_figures
    assert (
        fig._suptitle.get_text() == "Training curves; evaluation on validation, 144 images"
    )  # 0.5 s x 288/s
    assert named._suptitle.get_text().endswith("evaluation on test split, 9 images")
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        marks = {
            line.get_label(): line.get_xdata()[0]
            for line in ax.get_lines()
            if line.get_label()[:4] in ("best", "fina")
        }
        assert marks == {"best: step 20, accuracy 0.980": 20, "final: step 30, accuracy 0.950": 30}
        legend, panel = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.y0 >= panel.y1 - 1  # above the panel: on no curve
        assert ax.title.get_window_extent(renderer).y0 >= legend.y1 - 1  # and under the title
    loss, lr, accuracy, f1 = fig.axes
    low, high = accuracy.get_ylim()
    assert 0.8 < low < 0.88 and 0.99 <= high <= 1.01  # zoomed to 0.88..0.99, not 0..1
    assert 0.8 < f1.get_ylim()[0] < 0.87 and f1.get_ylim()[1] < 0.99
    assert {line.get_label() for line in named.axes[2].get_lines()} >= {
        "best = final: step 30, accuracy 0.950"
    }


def test_short_run_panels_say_there_are_no_training_logs(tmp_path, saved_figures):
    # max_steps below logging_steps: the Trainer logged the evaluation only
    history = [{"step": 3, "eval_loss": 0.5, "eval_accuracy": 0.8, "eval_top5_accuracy": 1.0, "eval_f1": 0.7}]
    plot_training_curves(history, tmp_path / "short.png")
    plot_training_curves([], tmp_path / "empty.png")
    short, empty = saved_figures
    loss, lr, accuracy, f1 = short.axes
    assert not lr.get_lines() and NO_LOGS in panel_texts(lr)
    mark = "best = final: step 3, accuracy 0.800"
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


def test_model_card_metadata_holds_the_test_metrics(tmp_path):
    (tmp_path / "run").mkdir()
    meta, body = front_matter(write_model_card(tmp_path / "run", RUN).read_text())
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["base_model"] == RUN["base_model"] and meta["datasets"] == ["AI-Lab-Makerere/beans"]
    assert {"vit_ft", "full-fine-tuning", "custom_code"} <= set(meta["tags"])
    (index,) = meta["model-index"]
    assert index["name"] == "run" and index["results"][0]["dataset"]["split"] == "test"
    metrics = {m["type"]: m["value"] for m in index["results"][0]["metrics"]}
    assert metrics == {"accuracy": 0.95, "top5_accuracy": 1.0, "f1": 0.94}
    assert (
        "| validation | 0.9000 | - | 0.8800 | - |" in body
        and "| test | 0.9500 | 1.0000 | 0.9400 | 0.2000 |" in body
    )
    assert 'model_dir = "path/to/run"  # the folder\'s path' in body
    assert "from_pretrained(model_dir, trust_remote_code=True)" in body and '"run"' not in body


CARD_FACTS = ("- Recipe: `beans`", "- Base model: [`google/vit-base-patch16-224-in21k`]", "- Resolution: 224x224",
              "- Fine-tuning: full", "- Dataset: `AI-Lab-Makerere/beans`", "| test | 0.9500 | 1.0000 | 0.9400 |")  # fmt: skip


@pytest.mark.parametrize("format", ["vit_ft", "transformers"])
def test_model_card_snippet_names_the_hub_id_when_pushed_and_the_folders_path_otherwise(tmp_path, format):
    _, pushed = front_matter(str(model_card(RUN, "me/vit-beans", tmp_path, format, repo_id="me/vit-beans")))
    _, local = front_matter(str(model_card(RUN, "beans-run", tmp_path, format)))
    assert '"me/vit-beans"' in pushed and "path/to" not in pushed
    assert 'model_dir = "path/to/beans-run"  # the folder\'s path' in local and '"beans-run"' not in local
    loads = "model=" if format == "transformers" else "from_pretrained("
    assert f'{loads}"me/vit-beans"' in pushed and f"{loads}model_dir" in local
    for body in (pushed, local):
        assert all(fact in body for fact in CARD_FACTS), body


def test_output_folders_card_snippet_runs_with_the_folders_path(tiny_finetuned_dir, tmp_path, monkeypatch):
    """The snippet of a fine-tune's README.md, with its placeholder replaced by the path, loads the model from
    anywhere (here another working directory)."""
    body = (tiny_finetuned_dir / "README.md").read_text()
    code = body.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'model_dir = "path/to/out"' in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code.replace("path/to/out", str(tiny_finetuned_dir)), scope)  # noqa: S102 - our own card's snippet
    assert scope["model"].config.num_labels == 10 and scope["processor"].size["height"] == 32


def test_model_card_without_test_metrics_reports_validation_and_hides_local_paths(tmp_path):
    run = {**RUN, "base_model": str(tmp_path), "lora": True, "metrics": {"eval_accuracy": 0.5}}
    card = model_card(run, "me/vit-beans", tmp_path, format="transformers", repo_id="me/vit-beans")
    meta, body = front_matter(str(card))
    assert "base_model" not in meta and "lora" in meta["tags"] and "vit" in meta["tags"]
    assert meta["model-index"][0]["results"][0]["dataset"]["split"] == "validation"
    assert str(tmp_path) not in body and "a local checkpoint" in body
    assert (
        'pipeline("image-classification", model="me/vit-beans")' in body and "trust_remote_code" not in body
    )


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


def test_report_with_many_classes_shows_the_10_worst(tmp_path):
    table = [dict(zip(PER_CLASS_COLUMNS, (f"c{i}", 5, 5, 0.5, 0.5, i / 40), strict=True)) for i in range(40)]
    metrics = {"accuracy": 0.5, "top5_accuracy": 0.9, "f1": 0.49, "num_images": 200, "num_skipped": 0,
               "data": "an image folder", "image_size": [32, 32]}  # fmt: skip
    lines, notes = SingleLabel().report_lines(tmp_path, "someone/vit", metrics, table, {}, None)
    text = write_report_lines(tmp_path, lines, [*notes, "a note"]).read_text()
    shown = [
        line.split(" | ")[0].removeprefix("| ") for line in text.splitlines() if re.match(r"\| c\d", line)
    ]
    assert shown == [f"c{i}" for i in range(10)]
    assert "| 0.5000 | 0.9000 | 0.4900 | 200 |" in text and "- a note" in text
