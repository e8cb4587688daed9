"""The benchmark's own logic on a tiny ViT: FLOP counts, identical contenders, interleaving, the report's shape.

Nothing here asserts a speed: timings on a shared machine prove nothing in a unit test.
"""

import importlib.util
import io
import json
import math

import pytest
import torch
from PIL import Image
from transformers import ViTForImageClassification

from benchmarks import (
    SECTIONS,
    MatmulCeiling,
    Row,
    build_contenders,
    count_flops,
    forward_flops,
    interleave,
    naive_train_transform,
    quick_settings,
    run_benchmark,
    synthetic_photo,
    to_markdown,
)
from benchmarks.common import cpu_compute, without_emulated
from benchmarks.lora import _peak_training_memory
from benchmarks.profile import classify
from vit_ft import ViTFTForImageClassification
from vit_ft.utils import hardware

from .conftest import TINY


def tiny_settings(**overrides):
    values = {
        "variant": "tiny",
        "image_size": TINY["image_size"],
        "patch_size": TINY["patch_size"],
        "num_labels": 3,
        "overrides": {k: v for k, v in TINY.items() if k not in ("image_size", "patch_size")},
    }
    return quick_settings(**{**values, **overrides})


def test_forward_flops_equal_the_formula_and_the_flop_counter(tmp_path):
    settings = tiny_settings()
    config = settings.model_config()
    batch, hidden, inter = 2, TINY["hidden_size"], TINY["intermediate_size"]
    layers = TINY["num_hidden_layers"]
    patches = (TINY["image_size"] // TINY["patch_size"]) ** 2
    tokens = patches + 1
    linears = tokens * (3 * hidden * hidden + hidden * hidden + 2 * hidden * inter)  # qkv, proj, MLP
    per_layer = linears + 2 * tokens * tokens * hidden  # + scores and weighted values
    macs = patches * 3 * TINY["patch_size"] ** 2 * hidden + layers * per_layer + hidden * 3
    assert forward_flops(config, batch)["total"] == 2 * batch * macs

    ours, _ = build_contenders(settings, tmp_path)
    eager = ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    pixels = torch.randn(batch, 3, TINY["image_size"], TINY["image_size"])
    assert count_flops(ours, pixels) == 2 * batch * macs  # SDPA, linears in oneDNN (float32 on CPU)
    assert count_flops(eager, pixels) == 2 * batch * macs  # transformers' eager attention: plain matmuls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ceiling_runs_every_product_of_a_forward_pass(dtype):
    config = tiny_settings().model_config()
    ceiling = MatmulCeiling(config, batch_size=2, dtype=dtype)
    assert ceiling.flops == forward_flops(config, 2)["total"]
    assert len(ceiling.sequence) == 1 + 6 * TINY["num_hidden_layers"] + 1  # patches, layers, head
    assert set(ceiling.backends) == {"patch embedding", "qkv", "attention scores", "attention x values",
                                     "proj", "fc1", "fc2", "head"}  # fmt: skip
    assert ceiling() > 0


def test_contenders_carry_identical_weights(tmp_path):
    ours, theirs = build_contenders(tiny_settings(), tmp_path)
    assert theirs.config._attn_implementation == "sdpa"
    pixels = torch.randn(3, 3, TINY["image_size"], TINY["image_size"])
    with torch.no_grad():
        assert torch.allclose(ours(pixels).logits, theirs(pixels).logits, atol=1e-5)


def test_interleave_warms_up_then_rotates_the_order():
    calls = []
    contenders = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    contenders["d"] = lambda: calls.append("d") or 0.25  # reports its own time
    times = interleave(contenders, warmup=1, rounds=3)
    assert calls[:4] == list("abcd")
    assert calls[4:] == list("abcd") + list("bcda") + list("cdab")
    assert all(len(t) == 3 and min(t) >= 0 for t in times.values())
    assert times["d"] == [0.25, 0.25, 0.25]


def test_row_checks_its_target():
    common = {"section": "s", "measurement": "m", "unit": "u", "candidate": "a", "reference": "b"}
    assert Row(**common, candidate_value=1.2, reference_value=1.0, ratio=1.2, target=">= 1.10").met
    assert not Row(**common, candidate_value=0.8, reference_value=1.0, ratio=0.8, target="<= 0.75").met
    assert Row(**common, candidate_value=1.0, reference_value=1.0, ratio=1.0).met is None


def test_profile_kinds_sort_operators():
    assert classify("aten::addmm") == classify("aten::bmm") == classify("mkldnn::_linear_pointwise")
    assert classify("aten::addmm") == "matrix products"
    assert classify("aten::_scaled_dot_product_flash_attention_for_cpu").startswith("attention")
    assert classify("aten::gelu") == "GELU" and classify("aten::native_layer_norm") == "LayerNorm"
    assert classify("aten::_to_copy") == "casts and copies" and classify("aten::add").startswith(
        "element-wise"
    )
    assert classify("aten::view") == "other"


def test_synthetic_photo_and_naive_transform():
    data = synthetic_photo(64, 48, seed=0)
    with Image.open(io.BytesIO(data)) as img:
        assert (img.format, img.size) == ("JPEG", (64, 48))
    pixels = naive_train_transform(data, (32, 24), (0.5,) * 3, (0.5,) * 3, Image.Resampling.BICUBIC)
    assert pixels.shape == (3, 32, 24) and pixels.dtype == torch.float32
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0


def test_emulated_bf16_rows_are_skipped_with_a_line_and_the_kernels_are_stated(monkeypatch):
    """On a CPU without native bf16 (forced here, so that every CPU tests it) the bf16 CPU rows are dropped with
    one line; bf16 alone is a one-line error; the report states the CPU flags and each precision's kernels."""
    monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, "1")
    settings, notes = without_emulated(tiny_settings())
    assert settings.dtypes == ("fp32",) and len(notes) == 1
    assert "bf16 were skipped" in notes[0] and hardware.EMULATED_BF16_SLOWDOWN in notes[0]
    with pytest.raises(ValueError, match=r"^--dtypes bf16: .*; pass --dtypes fp32\.$"):
        without_emulated(tiny_settings(dtypes=("bf16",)))
    monkeypatch.delenv(hardware.NO_NATIVE_BF16_ENV)
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: True)
    assert without_emulated(tiny_settings()) == (tiny_settings(), [])  # native bf16: every row runs
    result = run_benchmark(tiny_settings(sections=("data",), dtypes=("fp32", "bf16"), photos_per_round=1))
    markdown = to_markdown(result)
    assert f"CPU flags: {' '.join(hardware.cpu_flags()) or 'none of'}" in markdown
    assert "Kernels of the CPU rows: fp32: " in markdown and "; bf16: " in markdown


@pytest.mark.long
def test_memory_probe_counts_at_least_the_weights_gradients_and_adam_state():
    # a fresh process, as the benchmark runs it, and a model big enough to show: full fine-tuning touches the
    # weights, their gradients and AdamW's two moments, so the peak is at least four times the weights
    size = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}
    settings = tiny_settings(overrides=size)
    model_bytes = 4 * sum(p.numel() for p in ViTFTForImageClassification(settings.model_config()).parameters())
    peak = _peak_training_memory(settings, "full", "fp32")
    assert math.isfinite(peak) and peak >= 4 * model_bytes / 2**20


@pytest.mark.long
def test_quick_run_covers_every_section_with_sane_rows():
    threads = torch.get_num_threads()
    # the gpu section's code on the CPU: the same calls, with the device and size it was given
    result = run_benchmark(tiny_settings(rounds=2, gpu_device="cpu"))
    assert torch.get_num_threads() == threads  # restored
    rows = result["rows"]
    assert {row["section"] for row in rows} == set(SECTIONS)
    for row in rows:
        assert row["candidate_value"] > 0 and row["reference_value"] > 0
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
        if row["ratio_low"] is not None:
            assert 0 < row["ratio_low"] <= row["ratio_high"]
        assert (row["met"] is None) == (row["target"] is None)
    measurements = [row["measurement"] for row in rows if row["section"] in ("model", "lora")]
    # bf16 where this CPU has native bf16 products; elsewhere skipped with a line (test_emulated_bf16_rows_...)
    dtypes = [dtype for dtype in ("fp32", "bf16") if not cpu_compute(dtype).emulated_bf16]
    assert list(result["kernels"]) == dtypes == list(result["settings"]["dtypes"])
    for dtype in dtypes:
        assert sum(m.startswith(f"inference, {dtype}") for m in measurements) == 1
        # same optimizer, ours with fused AdamW, LoRA against full
        assert sum(m.startswith("training step") and dtype in m for m in measurements) == 3
    assert sum(row["section"] == "ceiling" for row in rows) == 2 * len(dtypes)  # ours and theirs
    for dtype in dtypes:  # the profile's kinds add up to the whole call; products are among them
        profile = [row for row in rows if row["section"] == "profile" and f", {dtype}," in row["measurement"]]
        assert math.isclose(sum(row["ratio"] for row in profile), 1.0, rel_tol=1e-6)
        assert "vit_ft, matrix products" in {row["candidate"] for row in profile}
    augmented = [row for row in rows if row["section"] == "data" and "RandAugment" in row["measurement"]][0]
    assert "-> 48 px" in augmented["measurement"] and "DataLoader workers" in augmented["note"]
    pipeline = [row for row in rows if row["section"] == "pipeline"]
    assert len(pipeline) == 1 and "(6 images, 2 decode workers)" in pipeline[0]["measurement"]
    compiled = [row for row in rows if row["section"] == "compile"]
    assert len(compiled) == 4 * len(dtypes)  # inference and training: compiled vs eager, best vs best
    against_eager = sum("torch.compile (eager) against eager" in row["measurement"] for row in compiled)
    assert against_eager == 2 * len(dtypes)
    assert {row["target"] for row in compiled} == {">= 1.00", ">= 1.10"}
    onnx = [row for row in rows if row["section"] == "onnx"]  # fp32 and int8, each against eager and compiled
    graphs = ["onnxruntime fp32", "onnxruntime int8 (dynamic)"]
    installed = [importlib.util.find_spec(name) is not None for name in ("openvino", "nncf")]  # vit-ft[deploy]
    graphs += ["OpenVINO fp32"] * installed[0] + ["OpenVINO int8 (NNCF)"] * all(installed)
    assert [(row["candidate"], row["reference"]) for row in onnx] == [
        (graph, ours) for graph in graphs for ours in ("vit_ft eager", "vit_ft + torch.compile")]  # fmt: skip
    assert float(onnx[0]["note"].split()[-1]) <= 1e-4 and "logit difference" in onnx[2]["note"]
    gpu = [row for row in rows if row["section"] == "gpu"]
    assert all("bf16, 48 px, batch 4, on cpu" in row["measurement"] for row in gpu), gpu
    # inference and training: eager ours / theirs, compiled / eager, best / best; then the FLOP utilisation
    assert sum(": eager" in row["measurement"] for row in gpu) == 2
    assert sum("against eager" in row["measurement"] for row in gpu) == 2
    assert sum("best of eager and torch.compile" in row["measurement"] for row in gpu) == 2
    (utilisation,) = [row for row in gpu if "FLOP utilisation" in row["measurement"]]
    assert utilisation["target"] == ">= 0.45" and "measured bf16 512x512" in utilisation["reference"]
    assert len(gpu) == 7
    markdown = to_markdown(result)
    assert markdown.count("\n| ") == len(rows) + 2  # header, rule, one line per row
    json.dumps(result)


def test_gpu_section_without_the_device_is_a_note_not_a_failure():
    settings = tiny_settings(sections=("gpu",), gpu_device="cuda")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the section runs")
    result = run_benchmark(settings)
    assert result["rows"] == []
    assert any("No cuda device here" in note for note in result["notes"])


def test_unknown_section_is_an_error():
    with pytest.raises(ValueError, match="Unknown section"):
        quick_settings(sections=("model", "tpu"))


def test_summarize_runs_reports_the_median_and_meets_a_target_only_in_the_worst_run():
    from benchmarks.report import repeated_markdown, summarize_runs

    def result(ratio_a, ratio_b, load):
        rows = [
            Row("model", "inference", "images/s", "ours", 2.0, "theirs", 1.0, ratio_a, target=">= 1.10"),
            Row("lora", "memory", "MiB", "lora", 1.0, "full", 2.0, ratio_b, target="<= 0.75"),
        ]
        machine = {"cpu": "cpu", "logical_cpus": 2, "torch": "2"}
        return {"rows": [r.__dict__ for r in rows], "machine": machine, "load_average": {"before": [load]}}

    summary = summarize_runs([result(1.3, 0.6, 0.1), result(1.05, 0.7, 2.0), result(1.2, 0.74, 0.3)])
    speed, memory = summary["rows"]
    assert (speed["ratio_median"], speed["ratio_low"], speed["ratio_high"]) == (1.2, 1.05, 1.3)
    assert speed["met"] is False  # the median meets 1.10, the worst run does not
    assert memory["ratio_median"] == 0.7 and memory["met"] is True
    markdown = repeated_markdown(summary)
    assert "| 1.2x | 1.05-1.30 | >= 1.10 | **no** |" in markdown and "3 separate runs" in markdown


@pytest.mark.long  # three benchmark runs, each its own process
def test_repeat_runs_separate_processes_and_summarizes(tmp_path):
    import subprocess
    import sys

    from .conftest import REPO

    out = tmp_path / "bench"
    args = [
        "--quick",
        "--sections",
        "model",
        "--dtypes",
        "fp32",
        "--rounds",
        "1",
        "--repeat",
        "2",
        "--pause",
        "0",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), *args, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "benchmark-repeated.json").read_text())
    runs = [json.loads((out / f"run-{k}" / "benchmark.json").read_text()) for k in (1, 2)]
    assert summary["runs"] == 2 and len(summary["rows"]) == len(runs[0]["rows"]) == 3  # inference, 2 training
    for row in summary["rows"]:
        assert row["ratios"] == [
            next(r["ratio"] for r in run["rows"] if r["measurement"] == row["measurement"] and
                 r["candidate"] == row["candidate"])
            for run in runs
        ]  # fmt: skip
    assert "median ratio" in result.stdout
