"""`vit-ft export --format onnx [--quantize int8]`: the graphs run in onnxruntime and give PyTorch's logits (fp32
within 1e-4; int8: the same top-1 on at least 95% of the digits test images, measured 100% on the tiny
fine-tune), with the processor and labels beside them; the folder rules and the missing-package line."""

from __future__ import annotations

import errno
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from vit_ft.commands.export import export, main
from vit_ft.tools.export import onnx as onnx_export
from vit_ft.tools.export.onnx_runtime import INT8_FILE, ONNX_FILE, OnnxClassifier
from vit_ft.tools.trained import load_trained
from vit_ft.utils.output_dir import OUTPUT_RECORD


@pytest.fixture(scope="module")
def exported(tiny_finetuned_dir, tmp_path_factory):
    """The tiny digits fine-tune exported once, fp32 and int8, by the command's own function."""
    out = tmp_path_factory.mktemp("onnx") / "digits-onnx"
    summary = export(["--model", str(tiny_finetuned_dir), "--output_dir", str(out), "--quantize", "int8",
                      "--evaluate", "test"])  # fmt: skip
    return out, summary


def digits_test_pixels(folder: Path, trained) -> tuple[torch.Tensor, list[str]]:
    """The fine-tune's recorded test images through the model's own eval transform."""
    test_dir = json.loads((folder / "vit_ft_run.json").read_text())["data"]["test_dir"]
    files = sorted(Path(test_dir).glob("*/*.png"))
    pixels = torch.stack([trained.transform.transform_image(str(f)) for f in files])
    return pixels, [f.parent.name for f in files]


def test_onnx_graphs_give_pytorchs_logits(exported, tiny_finetuned_dir):
    out, summary = exported
    assert sorted(p.name for p in out.iterdir()) == [
        OUTPUT_RECORD, "config.json", INT8_FILE, ONNX_FILE, "preprocessor_config.json"]  # fmt: skip
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    trained = load_trained(tiny_finetuned_dir, device="cpu")
    config = json.loads((out / "config.json").read_text())
    assert {int(k): v for k, v in config["id2label"].items()} == trained.id2label and "auto_map" not in config
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["size"] == {"shortest_edge": 32} and processor["crop_size"] == {"height": 32, "width": 32}
    assert processor["image_mean"] == list(trained.preprocessing.mean)

    pixels, names = digits_test_pixels(tiny_finetuned_dir, trained)
    expected = trained.logits(pixels) / trained.temperature  # the temperature is folded into the graph's head
    fp32, int8 = OnnxClassifier(out / ONNX_FILE), OnnxClassifier(out / INT8_FILE)
    assert (fp32.logits(pixels) - expected).abs().max().item() <= 1e-4
    for batch in (1, 7):  # the batch is dynamic
        assert (fp32.logits(pixels[:batch]) - expected[:batch]).abs().max().item() <= 1e-4
    assert "any height and width" in summary  # this exporter resamples the position table inside the graph
    larger = torch.nn.functional.interpolate(pixels[:4], size=(48, 40), mode="bilinear")
    assert (fp32.logits(larger) - trained.logits(larger) / trained.temperature).abs().max().item() <= 1e-4

    agreement = (int8.logits(pixels).argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert len(names) > 300 and agreement >= 0.95, f"int8 top-1 agreement {agreement:.3f}"
    # --evaluate: the recorded test split through each runtime; fp32 predicts exactly what PyTorch predicts
    accuracy = re.search(
        r"PyTorch (\S+), ONNX fp32 (\S+), ONNX int8 (\S+); .* ONNX fp32 100.0%, ONNX int8", summary
    )
    assert accuracy and accuracy[1] == accuracy[2], summary


def test_export_folder_rules_hold_before_the_model_loads(exported, tiny_finetuned_dir, tmp_path, capsys):
    out, _ = exported
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    (other / "config.json").write_text("{}")  # the user's, of an export file's name
    cases = {
        str(out): "holds an ONNX export (config.json, model.int8.onnx, model.onnx and 1 more); pass "
        "--overwrite to replace it (the folder's other files are kept), or another --output_dir",
        str(tiny_finetuned_dir / "onnx"): "is inside the input folder",
        str(other): "holds config.json, not written there by vit_ft export; pass --overwrite to replace it",
        str(out / ONNX_FILE): "is a file, not a folder; pass a folder for model.onnx and its files",
    }
    for target, words in cases.items():
        folder, *flags = target.split(" ")
        with pytest.raises(SystemExit) as exit_info:
            main(["--model", str(tiny_finetuned_dir), "--output_dir", folder, *flags])
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 1 and len(lines) == 1 and words in lines[0], lines
    assert (other / "keep.txt").read_text() == "mine" and not (tiny_finetuned_dir / "onnx").exists()
    assert (other / "config.json").read_text() == "{}"


def test_a_full_disk_while_exporting_is_the_full_disk_line_not_the_dynamic_size(
    tiny_finetuned_dir, tmp_path, monkeypatch, capsys
):
    """ENOSPC from the dynamic-size export goes through its fallback's `except` as what it is."""
    tried = []

    def full_disk(model, path, trace):
        tried.append(trace.dynamic_size)
        path.write_bytes(b"half a graph")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(onnx_export, "_export_graph", full_disk)
    out = tmp_path / "onnx"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(tiny_finetuned_dir), "--output_dir", str(out)])
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 1 and tried == [True], (tried, line)
    assert "Traceback" not in captured.err
    assert line.startswith(f"error: no space left on the disk holding {out / ONNX_FILE} ("), line
    fix = "Free some space, or pass --output_dir on another disk."
    assert line.endswith(f"free there); nothing in {out} was changed. {fix}"), line
    assert "dynamic-size" not in captured.out + captured.err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # no half graph, no staging folder


def test_missing_onnxruntime_is_one_line_naming_the_install(monkeypatch, tiny_finetuned_dir, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:  # a real model (a missing one is its own line, first)
        main(["--model", str(tiny_finetuned_dir), "--output_dir", str(tmp_path / "out")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and "onnxruntime missing here" in line
    assert "Install them with: pip install 'vit-ft[export]'" in line and not (tmp_path / "out").exists()
