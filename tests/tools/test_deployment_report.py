"""`vit-ft export --report`: deployment.md and .json with a row per runtime (accuracy, agreement with PyTorch,
latency, throughput, recommendation) on the tiny digits fine-tune; the int8 rule on its own. Structure and
agreement only, never timings (the timings are a benchmark: docs/performance.md)."""

from __future__ import annotations

import json
import re

import pytest

from vit_ft.commands.export import export, main
from vit_ft.tools.export import runtimes
from vit_ft.tools.export.onnx_runtime import ONNX_FILE
from vit_ft.tools.export.report import RuntimeRow, recommend_int8
from vit_ft.tools.export.runtimes import openvino_missing
from vit_ft.utils.output_dir import OUTPUT_RECORD

RUNTIMES = ["PyTorch eager", "PyTorch compiled", "onnxruntime fp32", "onnxruntime int8", "OpenVINO fp32",
            "OpenVINO int8"]  # fmt: skip


def row(name: str, accuracy: float | None, latency: float | None, throughput: float | None) -> RuntimeRow:
    return RuntimeRow(name, accuracy=accuracy, latency_ms=latency, throughput=throughput)


FP32 = row("onnxruntime fp32", 0.9500, 10.0, 100.0)


@pytest.mark.parametrize(
    ("int8", "expected", "why"),
    [
        (row("int8", 0.9500, 5.0, 200.0), True, "yes: faster than onnxruntime fp32, accuracy +0.00"),
        (row("int8", 0.9450, 5.0, 200.0), True, "yes"),  # exactly 0.5 points below: within
        (row("int8", 0.9600, 5.0, 200.0), True, "yes"),  # more accurate
        (row("int8", 0.9440, 5.0, 200.0), False, "0.60 points below"),
        (row("int8", 0.9500, 12.0, 200.0), False, "not faster"),  # slower at batch 1
        (row("int8", 0.9500, 5.0, 90.0), False, "not faster"),  # slower at batch 32
        (row("int8", 0.9500, 10.0, 100.0), False, "not faster"),  # as fast is not faster
        (row("int8", None, None, None), False, "not measured"),
    ],
)
def test_int8_is_recommended_only_faster_and_within_half_a_point(int8, expected, why):
    recommended, reason = recommend_int8(int8, FP32)
    assert recommended is expected and why in reason


@pytest.fixture(scope="module")
def reported(tiny_finetuned_dir, tmp_path_factory):
    """The tiny digits fine-tune exported with --report once (torch.compile tracing only: inductor takes minutes)."""
    out = tmp_path_factory.mktemp("deploy") / "digits-onnx"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtimes, "COMPILE_BACKEND", "eager")
        summary = export(["--model", str(tiny_finetuned_dir), "--output_dir", str(out), "--report",
                          "--report_warmup", "1", "--report_repeats", "3"])  # fmt: skip
    return out, summary


@pytest.mark.slow  # the export with its report: about a minute on 2 busy cores
def test_report_has_a_row_per_runtime_and_agrees_with_pytorch(reported):
    out, summary = reported
    report = json.loads((out / "deployment.json").read_text())
    rows = {r["runtime"]: r for r in report["rows"]}
    assert list(rows) == RUNTIMES and report["num_images"] > 10 and "test" in report["split"]
    assert (report["warmup"], report["repeats"]) == (1, 3)  # the flags' timing, stated in the report
    assert "median of 3 calls" in (out / "deployment.md").read_text()
    absent = openvino_missing()
    measured = [name for name in RUNTIMES if not (name.startswith("OpenVINO") and (
        "openvino" in absent or (name.endswith("int8") and "nncf" in absent)))]  # fmt: skip
    for name in measured:
        r = rows[name]
        assert r["latency_ms"] > 0 and r["throughput"] > 0 and 0 <= r["accuracy"] <= 1, r
        # fp32 runtimes predict what PyTorch predicts; int8 rounds, and may move a close call
        assert r["agreement"] >= (0.95 if name.endswith("int8") else 0.995), r
    assert rows["PyTorch eager"]["agreement"] == 1.0
    for name in set(RUNTIMES) - set(measured):  # not installed: one line naming the install, no numbers
        assert rows[name]["accuracy"] is None and "vit-ft[deploy]" in rows[name]["note"]
    for name in ("onnxruntime int8", "OpenVINO int8"):
        if name in measured:
            assert rows[name]["recommended"].split(":")[0] in ("yes", "no")
    assert report["recommended"] in measured and "fastest" in rows[report["recommended"]]["recommended"]
    markdown = (out / "deployment.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| runtime")]
    assert [line.split(" | ")[0][2:] for line in table] == RUNTIMES
    assert f"fastest recommended {report['recommended']}" in summary


@pytest.mark.slow  # the export with its report: about a minute on 2 busy cores
def test_int8_graphs_keep_layernorm_and_softmax_in_fp32(reported):
    out, _ = reported
    ops = runtimes.onnx_int8_ops(out / "model.int8.onnx")
    assert ops.get("MatMulInteger", 0) > 0 and ops["LayerNormalization"] > 0 and ops["Softmax"] > 0, ops
    assert not any(name.startswith("QLinear") for name in ops), ops  # softmax or LayerNorm in int8
    notes = {r["runtime"]: r["note"] for r in json.loads((out / "deployment.json").read_text())["rows"]}
    assert "LayerNormalization" in notes["onnxruntime int8"]
    if not openvino_missing():  # NNCF's transformer preset: int8 inputs only for the matrix products
        fed = notes["OpenVINO int8"].split(": ", 1)[1]
        assert "MatMul" in fed and "MVN" not in fed and "Softmax" not in fed, fed


@pytest.mark.slow  # the export with its report: about a minute on 2 busy cores
def test_report_files_are_the_exports_and_go_with_a_new_export(reported, tiny_finetuned_dir):
    out, _ = reported
    record = (out / OUTPUT_RECORD).read_text()
    assert "deployment.md" in record and "deployment.json" in record and (out / ONNX_FILE).is_file()
    (out / "mine.txt").write_text("kept")
    export(["--model", str(tiny_finetuned_dir), "--output_dir", str(out), "--overwrite"])  # no --report
    assert not (out / "deployment.md").exists() and not (out / "deployment.json").exists()  # not stale
    assert (out / "mine.txt").read_text() == "kept"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--report", "nosuch"], "nosuch"),  # a split the fine-tune did not record: named, before the export
        (["--report", "test", "--quantize", "int4"], "invalid choice: 'int4'"),
    ],
)
def test_bad_report_input_is_one_line_and_writes_nothing(tiny_finetuned_dir, tmp_path, capsys, flags, expected):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(tiny_finetuned_dir), "--output_dir", str(out), *flags])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code != 0 and expected in lines[-1] and not out.exists(), lines


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--report_repeats", "3"], "error: --report_repeats sets how --report times the runtimes; add --report."),
        (["--report", "--report_repeats", "0"], "use a warm-up of 0 or more and at least 1 repeat"),
        (["--report", "--report_warmup", "-1"], "use a warm-up of 0 or more and at least 1 repeat"),
    ],
)
def test_report_timing_flags_are_checked_in_one_line(tmp_path, capsys, flags, said):
    """Checked with the flags, before the model loads (the command prints the ValueError as its one line)."""
    from vit_ft.commands.export import parse_args

    with pytest.raises(ValueError, match=re.escape(said.removeprefix("error: "))) as error:
        parse_args(["--model", str(tmp_path), "--output_dir", str(tmp_path / "out"), *flags])
    assert "\n" not in str(error.value)
