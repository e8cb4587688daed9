"""Tests for vit_ft.reporting: training curves, the model card, Markdown and CSV tables, the report."""

import csv
import re

import pytest
import yaml
from PIL import Image

from vit_ft.reporting import (
    PER_CLASS_COLUMNS,
    markdown_table,
    model_card,
    plot_training_curves,
    write_csv,
    write_model_card,
    write_report,
)

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


@pytest.mark.parametrize(
    "log_history",
    [
        [],
        [{"step": s, "loss": 2.0 / s, "learning_rate": 1e-3 * s} for s in range(1, 6)]
        + [{"step": 5, "eval_loss": 0.5, "eval_accuracy": 0.8, "eval_top5_accuracy": 1.0, "eval_f1": 0.7}],
    ],
    ids=["empty", "normal"],
)
@pytest.mark.filterwarnings("ignore:No artists with labels found")  # the empty history's loss legend
def test_training_curves_png(tmp_path, log_history):
    path = plot_training_curves(log_history, tmp_path / "curves.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1500, 400)


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
    assert 'from_pretrained("run", trust_remote_code=True)' in body


def test_model_card_without_test_metrics_reports_validation_and_hides_local_paths(tmp_path):
    run = {**RUN, "base_model": str(tmp_path), "lora": True, "metrics": {"eval_accuracy": 0.5}}
    card = model_card(run, "me/vit-beans", tmp_path, format="transformers")
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
    text = write_report(tmp_path, "someone/vit", metrics, table, {}, ["a note"]).read_text()
    shown = [
        line.split(" | ")[0].removeprefix("| ") for line in text.splitlines() if re.match(r"\| c\d", line)
    ]
    assert shown == [f"c{i}" for i in range(10)]
    assert "| 0.5000 | 0.9000 | 0.4900 | 200 |" in text and "- a note" in text
