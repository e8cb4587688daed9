"""The tools as a user meets them (predict, evaluate, inspect, push_to_hub, bench, the demo's start-up): each mistake
is one line `error: ...` on stderr and exit code 1, no traceback (unless --debug), and every file the user
had (the images, an existing output, the model folders) is byte-identical afterwards. Each case runs the real
script (`python SCRIPT ARGS`): one case per tool in a subprocess, the real command line (IN_A_PROCESS, two at a
time), the others in this process through `tests.cli_runner.run_script`, which runs the same script file with the
same arguments, working folder and environment, without a fresh interpreter's imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_ft.tools.predict.run import PredictionWriter

from ..cli_runner import run_script
from ..conftest import REPO

TOOLS = {
    "predict": "scripts/predict.py",
    "evaluate": "scripts/evaluate_model.py",
    "inspect": "scripts/inspect_model.py",
    "push": "scripts/push_to_hub.py",
    "demo": "demo/app.py",
    "bench": "scripts/bench.py",
    "fewshot": "scripts/fewshot.py",
}

# id -> (tool, arguments, extra environment, words the error line must hold). In the arguments {model} is the
# tiny fine-tune, {hf} the transformers classifier, {data} the folder of its recorded test split, {w} the
# case's workspace (photos/, keep.csv, own/results.png, classes/, trunc/, lora/).
CASES = {
    "predict: missing model path, existing output kept": (
        "predict", ["--model", "{w}/no/such/model", "{w}/photos", "--output", "{w}/keep.csv"], {},
        "no/such/model: no such folder; pass a model folder",
    ),
    "predict: figure would replace the input": (
        "predict", ["--model", "{hf}", "{w}/photos/cat.png", "--output", "{w}/photos/cat.csv"], {},
        "would replace an input image",
    ),
    "predict: output is an input": (
        "predict", ["--model", "{hf}", "{w}/keep.csv", "--output", "{w}/keep.csv"], {}, "is one of the input files",
    ),
    "predict: --max_pixels 0": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv", "--max_pixels", "0"], {},
        "max_pixels=0 must be positive",
    ),
    "predict: a device torch does not know": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv", "--device", "gpu"], {},
        "--device 'gpu' is not a device name; pass cpu, cuda",
    ),
    "evaluate: --max_samples 0": (
        "evaluate", ["--model", "{hf}", "--output_dir", "{w}/report", "--data_dir", "{w}/photos", "--max_samples", "0"],
        {}, "max_samples=0 must be positive",
    ),
    "predict: glob matches nothing": (
        "predict", ["--model", "{hf}", "{w}/photos/*.jpg", "--output", "{w}/out.csv"], {}, "no image file in",
    ),
    "predict: too many tokens": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv", "--image_size", "512"], {},
        "--max_tokens 16384",
    ),
    "predict: truncated weights": (
        "predict", ["--model", "{w}/trunc", "{w}/photos", "--output", "{w}/keep.csv"], {},
        "trunc/model.safetensors cannot be read",
    ),
    "predict: LoRA base model path missing": (
        "predict", ["--model", "{w}/lora", "{w}/photos", "--output", "{w}/keep.csv"], {},
        "outputs/base-model (relative to the folder the fine-tune ran in)",
    ),
    "predict: unfinished run": (
        "predict", ["--model", "{w}/unfinished", "{w}/photos", "--output", "{w}/keep.csv"], {},
        "did not finish (vit_ft_run.json says finished: false); resume it",
    ),
    "predict: unknown flag": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv", "--topk", "3"], {},
        "unrecognized arguments: --topk 3 (run predict.py --help",
    ),
    "predict: figure would be the output": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv", "--figure", "{w}/keep.csv"], {},
        "is the --output file",
    ),
    "predict: output exists and is not predict's": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/keep.csv"], {},
        "keep.csv exists and was not written by predict; pass --overwrite to replace it, or another --output",
    ),
    "predict: figure would replace a file that is not predict's": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/own/results.csv"], {},
        "own/results.png exists and was not written by predict; pass --overwrite to replace it, or another --figure",
    ),
    "predict: --figure names a file that is not predict's": (
        "predict", ["--model", "{hf}", "{w}/photos", "--output", "{w}/new.csv", "--figure", "{w}/own/results.png"],
        {}, "own/results.png exists and was not written by predict",
    ),
    "evaluate: output is the model folder": (
        "evaluate", ["--model", "{model}", "--output_dir", "{model}"], {}, "is inside the input folder",
    ),
    "evaluate: output inside the model folder": (
        "evaluate", ["--model", "{model}", "--output_dir", "{model}/report"], {}, "is inside the input folder",
    ),
    "evaluate: output inside the --data_dir": (
        "evaluate", ["--model", "{model}", "--data_dir", "{w}/classes", "--output_dir", "{w}/classes/cat"], {},
        "classes/cat is inside the input folder",
    ),
    "evaluate: output inside the recorded data": (
        "evaluate", ["--model", "{model}", "--output_dir", "{data}/report"], {}, "is inside the input folder",
    ),
    "evaluate: --data_dir missing": (
        "evaluate", ["--model", "{model}", "--data_dir", "{w}/nowhere", "--output_dir", "{w}/report"], {},
        "nowhere is not a directory; pass a folder laid out as <folder>/<class name>/<image file>",
    ),
    "evaluate: --data_dir without class folders": (
        "evaluate", ["--model", "{model}", "--data_dir", "{w}/photos", "--output_dir", "{w}/report"], {},
        "photos: images must sit directly in class sub-folders",
    ),
    "inspect: output is the model folder": (
        "inspect", ["--model", "{model}", "--output_dir", "{model}"], {}, "is inside the input folder",
    ),
    "inspect: output inside the --data_dir": (
        "inspect", ["--model", "{model}", "--data_dir", "{w}/classes", "--output_dir", "{w}/classes/figs"], {},
        "classes/figs is inside the input folder",
    ),
    "fewshot: output inside the model folder": (
        "fewshot", ["--model", "{model}", "--dataset", "{w}/classes", "--output_dir", "{model}/fewshot"], {},
        "is inside the input folder",
    ),
    "evaluate: too many tokens": (
        "evaluate", ["--model", "{hf}", "--data_dir", "{w}/photos", "--output_dir", "{w}/report", "--image_size", "512"],
        {}, "--max_tokens 16384",
    ),
    "evaluate: missing --output_dir": (
        "evaluate", ["--model", "{model}"], {}, "the following arguments are required: --output_dir",
    ),
    "evaluate: value of the wrong type": (
        "evaluate", ["--model", "{model}", "--output_dir", "{w}/report", "--batch_size", "many"], {},
        "argument --batch_size: invalid int value: 'many'",
    ),
    "evaluate: missing model path": (
        "evaluate", ["--model", "./no-such-model", "--output_dir", "{w}/report"], {}, "./no-such-model: no such folder",
    ),
    "inspect: zero images": (
        "inspect", ["--model", "{model}", "--output_dir", "{w}/figures", "--num_images", "0"], {},
        "--num_images 0 must be positive",
    ),
    "inspect: too many tokens": (
        "inspect", ["--model", "{hf}", "--output_dir", "{w}/figures", "--image_size", "512"], {}, "--max_tokens 16384",
    ),
    "push: unknown flag": ("push", ["{model}", "--hub_model_id", "me/x", "--privat"], {}, "unrecognized arguments"),
    "push: id with two slashes": ("push", ["{model}", "--hub_model_id", "a/b/c"], {}, "is not a repo id"),
    "push: offline": ("push", ["{model}", "--hub_model_id", "me/vit-digits"], {}, "--local_dir"),
    "push: truncated weights are not staged": (
        "push", ["{w}/trunc", "--hub_model_id", "me/x", "--local_dir", "{w}/staged"], {},
        "trunc/model.safetensors cannot be read",
    ),
    "demo: missing model path": ("demo", ["--model", "{w}/no/such/model"], {}, "no such folder"),
    "demo: unknown flag": ("demo", ["--model", "{model}", "--prot", "7860"], {}, "unrecognized arguments: --prot 7860"),
    "bench: unknown section": (
        "bench", ["--quick", "--sections", "modle", "--output-dir", "{w}/bench"], {}, "Unknown section(s) ['modle']",
    ),
    "bench: unknown flag": ("bench", ["--quick", "--round", "3"], {}, "unrecognized arguments: --round 3"),
}  # fmt: skip

# one case per tool runs as a real process (`python SCRIPT ARGS`, exit status and stderr of the process itself):
# the case of each that goes deepest (a model or data loaded before the error), and the offline push, as
# huggingface_hub reads HF_HUB_OFFLINE when it is imported
IN_A_PROCESS = (
    "predict: truncated weights",
    "evaluate: --data_dir without class folders",
    "inspect: too many tokens",
    "fewshot: output inside the model folder",
    "push: offline",
    "demo: missing model path",
    "bench: unknown section",
)
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def run_tool(
    tool: str, args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python TOOL ARGS` offline, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(REPO / TOOLS[tool]), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def make_workspace(folder: Path, model: Path) -> Path:
    """Two tiny images (photos/, and classes/<class>/ as an image folder), an existing predictions file and a
    figure that predict did not write, a copy of `model` with its weights cut short, one whose
    run record says it did not finish, and a LoRA adapter folder whose recorded base model is a relative path
    that does not exist here."""
    (folder / "photos").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            folder / "photos" / f"{name}.png"
        )
    (folder / "keep.csv").write_text("path,label\nyesterday.png,cat\n")
    (folder / "own").mkdir()
    Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / "own" / "results.png")
    for name in ("cat", "dog"):  # an image folder with two classes
        (folder / "classes" / name).mkdir(parents=True)
        shutil.copy(folder / "photos" / f"{name}.png", folder / "classes" / name / "1.png")
    shutil.copytree(model, folder / "trunc", ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    weights = folder / "trunc" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copytree(folder / "trunc", folder / "unfinished")
    record = json.loads((model / "vit_ft_run.json").read_text())
    (folder / "unfinished" / "vit_ft_run.json").write_text(json.dumps({**record, "finished": False}))
    (folder / "lora").mkdir()
    shutil.copy(model / "config.json", folder / "lora" / "config.json")
    (folder / "lora" / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "base_model_name_or_path": "outputs/base-model", "r": 4})
    )
    return folder


def prepare(case: str, workspace: Path, model: Path, hf: str) -> tuple[str, list[str], dict[str, str]]:
    """The case's workspace made, and (tool, its arguments, its extra environment)."""
    tool, args, env, _ = CASES[case]
    make_workspace(workspace, model)
    data = json.loads((model / "vit_ft_run.json").read_text())["data"]["test_dir"]
    return tool, [a.format(w=workspace, model=model, hf=hf, data=data) for a in args], env


@pytest.fixture(scope="module")
def processes(tmp_path_factory, tiny_finetuned_dir, hf_classifier_dir):
    """The IN_A_PROCESS cases run as `python SCRIPT ARGS`, two at a time: {id: (result, workspace, snapshot
    before, model snapshot before, model)}."""
    root = tmp_path_factory.mktemp("tool_errors")
    model = Path(tiny_finetuned_dir)
    jobs = {}
    for i, case in enumerate(IN_A_PROCESS):
        tool, args, env = prepare(case, root / f"case{i}", model, hf_classifier_dir)
        jobs[case] = (tool, args, env, root / f"case{i}", snapshot(root / f"case{i}"))
    model_before = snapshot(model)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            case: pool.submit(run_tool, tool, args, ws, env)
            for case, (tool, args, env, ws, _) in jobs.items()
        }
        return {
            case: (futures[case].result(), job[3], job[4], model_before, model) for case, job in jobs.items()
        }


@pytest.fixture
def run_case(request, tmp_path, capfd, monkeypatch, tiny_finetuned_dir, hf_classifier_dir):
    """case -> (result, workspace, snapshot before, model snapshot before, model): an IN_A_PROCESS case's
    subprocess, any other case run now in this process."""

    def run(case: str):
        if case in IN_A_PROCESS:
            return request.getfixturevalue("processes")[case]
        model, workspace = Path(tiny_finetuned_dir), tmp_path / "workspace"
        tool, args, env = prepare(case, workspace, model, hf_classifier_dir)
        before, model_before = snapshot(workspace), snapshot(model)
        if tool == "demo":  # a demo that did not refuse would serve until killed
            import gradio

            monkeypatch.setattr(gradio.Blocks, "launch", lambda *a, **k: pytest.fail("the demo started"))
        result = run_script(TOOLS[tool], args, capfd, cwd=workspace, env={**OFFLINE, **env})
        return result, workspace, before, model_before, model

    return run


def assert_one_line_error(result, expected: str) -> None:
    """`result`: a subprocess.CompletedProcess or a cli_runner.Ran."""
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("error: ") and expected in last, last


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_line_and_changes_nothing(run_case, case):
    result, workspace, before, model_before, model = run_case(case)
    assert_one_line_error(result, CASES[case][3])
    assert snapshot(workspace) == before  # nothing changed, nothing added (no figure, no half-staged folder)
    assert snapshot(model) == model_before


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("evaluate: --data_dir")])
def test_data_dir_mistakes_name_the_flag_not_a_training_field(run_case, case):
    last = run_case(case)[0].stderr.strip().splitlines()[-1]
    assert last.startswith("error: --data_dir ") and "train_dir" not in last, last


def test_an_output_inside_the_recorded_data_is_refused_before_anything_is_written(run_case):
    model = run_case("evaluate: output inside the recorded data")[4]
    data = Path(json.loads((model / "vit_ft_run.json").read_text())["data"]["test_dir"])
    assert data.is_dir() and not (data / "report").exists()


def test_debug_shows_the_traceback(tmp_path, capfd):
    args = [
        "--model",
        str(tmp_path / "no" / "model"),
        str(tmp_path),
        "--output",
        str(tmp_path / "p.csv"),
        "--debug",
    ]
    result = run_script(TOOLS["predict"], args, capfd, cwd=tmp_path, env=OFFLINE)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "FileNotFoundError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_failed_figure_keeps_the_old_figure(tmp_path, hf_classifier_dir, monkeypatch):
    """The figure is drawn to a temporary file and renamed when complete, like the rows."""
    import vit_ft.tools.predict.run as prediction

    (tmp_path / "photos").mkdir()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(tmp_path / "photos" / "red.png")
    old = tmp_path / "preds.png"
    old.write_bytes(b"yesterday's figure")

    def broken_grid(images, titles, path, suptitle=None):
        Path(path).write_bytes(b"half a figure")
        raise OSError("disk full")

    monkeypatch.setattr(prediction, "plot_image_grid", broken_grid)
    # overwrite=True: the old figure does not carry predict's mark (without it the run is refused, see below)
    with pytest.raises(OSError, match="disk full"):
        prediction.run_prediction(
            hf_classifier_dir, [tmp_path / "photos"], tmp_path / "preds.csv", overwrite=True
        )
    assert old.read_bytes() == b"yesterday's figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos", "preds.csv", "preds.png"]  # no .part left
    monkeypatch.undo()
    prediction.run_prediction(
        hf_classifier_dir, [tmp_path / "photos"], tmp_path / "preds.csv", overwrite=True
    )
    assert old.read_bytes().startswith(b"\x89PNG")  # a complete run replaces it


def test_a_failed_prediction_run_keeps_the_old_output_file(tmp_path):
    old = tmp_path / "keep.jsonl"
    old.write_text('{"path": "yesterday.png"}\n')
    with pytest.raises(KeyboardInterrupt), PredictionWriter(old) as writer:
        writer._file.write("half a row")
        raise KeyboardInterrupt
    assert old.read_text() == '{"path": "yesterday.png"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]  # the temporary file is gone
