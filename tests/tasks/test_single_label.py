"""Tests for vit_ft.tasks.single_label: the report's sections (the evaluation end to end:
tests/tools/test_evaluation.py)."""

import re

from vit_ft.reports.reporting import PER_CLASS_COLUMNS, write_report_lines
from vit_ft.tasks import SingleLabel


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
