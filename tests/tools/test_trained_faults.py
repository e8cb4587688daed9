"""Hostile and damaged trained folders, through the real commands (predict, evaluate, push, the demo): a trained
model loads whole or not at all, a config is checked against its weights' header before any layer is built, and
only the installed vit_ft's model code is published. Each case: exit code 1, exactly one `error:` line naming
the file and the tensor or field, no traceback, every file byte-identical afterwards. The case with a Hub id runs
`python SCRIPT ARGS` in a subprocess (huggingface_hub reads the fake Hub's HF_ENDPOINT when it is imported); the
others run the same script in this process through `tests.cli_runner.run_script` (each tool's command line in a
real process is tested by tests/tools/test_tool_errors.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import ViTImageProcessorPil

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.tools.trained import Trained, load_trained

from ..cli_runner import run_script
from ..conftest import REPO, TINY, randomize
from ..fake_hub import FakeHub
from .test_hub import push_env, write_lora_run

SCRIPTS = {
    "predict": "scripts/predict.py",
    "evaluate": "scripts/evaluate_model.py",
    "push": "scripts/push_to_hub.py",
    "demo": "demo/app.py",
}
REMOVED = "vit.layers.1.mlp.fc2.weight"


def _edit_weights(folder: Path, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def _edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _labels(n: int) -> dict:
    return {"id2label": {str(i): f"l{i}" for i in range(n)}, "label2id": {f"l{i}": i for i in range(n)}}


def _remove_adapter_tensor(folder: Path) -> None:
    file = folder / "adapter" / "adapter_model.safetensors"
    weights = load_file(file)
    weights.pop(sorted(k for k in weights if "lora_B" in k)[0])
    save_file(weights, file, metadata={"format": "pt"})


# the damage done to a copy of the good folder ("good"), or to a LoRA run ("lora")
DAMAGE = {
    "removed": ("good", lambda f: _edit_weights(f, lambda w: w.pop(REMOVED))),
    "extra": ("good", lambda f: _edit_weights(f, lambda w: w.update(extra=torch.zeros(3)))),
    "reshaped": ("good", lambda f: _edit_weights(f, lambda w: w.update({REMOVED: torch.zeros(32, 60)}))),
    "labels": ("good", lambda f: _edit_config(f, **_labels(10**6))),
    "layers4": ("good", lambda f: _edit_config(f, num_hidden_layers=10**4)),
    "layers5": ("good", lambda f: _edit_config(f, num_hidden_layers=10**5)),
    "hidden": ("good", lambda f: _edit_config(f, hidden_size=2**40)),
    "no_weights": ("good", lambda f: (f / "model.safetensors").unlink() or _edit_config(f, num_hidden_layers=10**5)),
    "code": ("good", lambda f: (f / "modeling_vit_ft.py").write_text((f / "modeling_vit_ft.py").read_text() + "\nprint('hi')\n")),
    "auto_map": ("good", lambda f: _edit_config(f, auto_map={"AutoModelForImageClassification": "evil/repo--m.Model"})),
    "std": ("good", lambda f: (f / "preprocessor_config.json").write_text(json.dumps({"image_std": [0.0, 0.5, 0.5]}))),
    "adapter_removed": ("lora", _remove_adapter_tensor),
    "adapter_layers": ("lora", lambda f: _edit_config(f / "adapter", num_hidden_layers=10**5)),
}  # fmt: skip

# id -> (command, its arguments, the damaged folder, words the error line must hold (one or several)). {m} is the damaged folder,
# {w} the case's workspace (photos/ as <class>/<image>); a "hub:" model is served by the fake Hub as me/damaged.
CASES = {
    "predict: a tensor removed": (
        "predict", ["--model", "{m}", "{w}/photos", "--output", "{w}/p.csv"], "removed",
        f"removed/model.safetensors lacks tensors the model needs: {REMOVED}",
    ),
    "evaluate: a tensor removed": (
        "evaluate", ["--model", "{m}", "--data_dir", "{w}/photos", "--output_dir", "{w}/report"], "removed",
        f"removed/model.safetensors lacks tensors the model needs: {REMOVED}",
    ),
    "demo: a tensor removed": ("demo", ["--model", "{m}"], "removed", f"model.safetensors lacks tensors the model needs: {REMOVED}"),
    "predict (Hub id): a tensor removed": (
        "predict", ["--model", "hub:me/damaged", "{w}/photos", "--output", "{w}/p.csv"], "removed",
        f"me/damaged/model.safetensors lacks tensors the model needs: {REMOVED}",
    ),
    "predict: an extra tensor": (
        "predict", ["--model", "{m}", "{w}/photos", "--output", "{w}/p.csv"], "extra",
        "extra/model.safetensors has tensors this model has no place for: ['extra']",
    ),
    "evaluate: a tensor of another shape": (
        "evaluate", ["--model", "{m}", "--data_dir", "{w}/photos", "--output_dir", "{w}/report"], "reshaped",
        f"reshaped/model.safetensors has tensors of another shape than the model's: {REMOVED} [32, 60]",
    ),
    "predict: id2label with 10^6 entries": (
        "predict", ["--model", "{m}", "{w}/photos", "--output", "{w}/p.csv"], "labels",
        ("labels/config.json: num_labels (entries in id2label) is 1000000, but ",
         "labels/model.safetensors holds 3 (classifier.weight [3, 32])"),
    ),
    "predict: 10^4 layers": (
        "predict", ["--model", "{m}", "{w}/photos", "--output", "{w}/p.csv"], "layers4",
        ("layers4/config.json: num_hidden_layers is 10000, but ", "layers4/model.safetensors holds 2 layers"),
    ),
    "evaluate: 10^5 layers": (
        "evaluate", ["--model", "{m}", "--data_dir", "{w}/photos", "--output_dir", "{w}/report"], "layers5",
        ("layers5/config.json: num_hidden_layers is 100000, but ", "layers5/model.safetensors holds 2 layers"),
    ),
    "predict: an absurd hidden_size": (
        "predict", ["--model", "{m}", "{w}/photos", "--output", "{w}/p.csv"], "hidden",
        ("hidden/config.json: hidden_size is 1099511627776, but ",
         "hidden/model.safetensors holds 32 (vit.embeddings.cls_token [1, 1, 32])"),
    ),
    "push: a modified modeling_vit_ft.py": (
        "push", ["{m}", "--hub_model_id", "me/x", "--local_dir", "{w}/staged", "--format", "vit_ft"], "code",
        "code/modeling_vit_ft.py differs from the model code of the installed vit_ft",
    ),
    "predict: a LoRA adapter missing a tensor": (
        "predict", ["--model", "{m}/adapter", "{w}/photos", "--output", "{w}/p.csv"], "adapter_removed",
        "adapter/adapter_model.safetensors lacks tensors the model needs: base_model.model.vit.layers.0",
    ),
}  # fmt: skip


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_good(folder: Path) -> Path:
    """A trained vit_ft folder as save_pretrained leaves it: three labels at 16x16, with its processor."""
    labels = ["ant", "bee", "wasp"]
    config = ViTFTConfig(
        **TINY, id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}
    )
    randomize(ViTFTForImageClassification(config)).save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, hf_classifier_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged")
    sources = {"good": write_good(root / "good"), "lora": root / "lora"}
    write_lora_run(hf_classifier_dir, sources["lora"])
    made = {}
    for name, (source, damage) in DAMAGE.items():
        shutil.copytree(sources[source], root / name)
        damage(root / name)
        made[name] = root / name
    return {**made, **sources}


def _run(script: str, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / SCRIPTS[script]), *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def _prepare(case: str, workspace: Path, folders: dict[str, Path]) -> tuple[str, list[str], list[Path]]:
    """The case's workspace (photos/ as <class>/<image>) made: (script, its arguments, the folders to snapshot)."""
    script, args, damaged, _ = CASES[case]
    for label in ("ant", "bee"):
        (workspace / "photos" / label).mkdir(parents=True)
        Image.new("RGB", (20, 20), (200, 10, 10)).save(workspace / "photos" / label / "a.png")
    model = folders[damaged or "good"]
    return script, [a.format(m=model, w=workspace).replace("hub:", "") for a in args], [workspace, model]


def _from_the_hub(case: str) -> bool:
    return any("hub:" in a for a in CASES[case][1])


@pytest.fixture(scope="module")
def hub_processes(tmp_path_factory, folders):
    """The Hub cases run as `python SCRIPT ARGS` against a fake Hub, two at a time: {id: (result, snapshots
    before, snapshots after)}."""
    root = tmp_path_factory.mktemp("faults")
    with FakeHub() as hub:
        hub.add_repo("me/damaged", folders["removed"])
        jobs = {}
        for i, case in enumerate(c for c in CASES if _from_the_hub(c)):
            script, args, snapshotted = _prepare(case, root / f"case{i}", folders)
            env = push_env(hub, root / f"hub{i}")  # its cache outside the workspace
            jobs[case] = (script, args, root / f"case{i}", env, snapshotted)
        before = {case: [snapshot(f) for f in job[4]] for case, job in jobs.items()}
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {case: pool.submit(_run, *job[:4]) for case, job in jobs.items()}
            done = {case: future.result() for case, future in futures.items()}
    return {case: (done[case], before[case], [snapshot(f) for f in jobs[case][4]]) for case in jobs}


@pytest.fixture
def run_case(request, tmp_path, capfd, monkeypatch, folders):
    """case -> (result, snapshots before, snapshots after): a Hub case's subprocess, any other case run now in
    this process, offline."""

    def run(case: str):
        if _from_the_hub(case):
            return request.getfixturevalue("hub_processes")[case]
        script, args, snapshotted = _prepare(case, tmp_path / "workspace", folders)
        before = [snapshot(f) for f in snapshotted]
        if script == "demo":  # a demo that did not refuse would serve until killed
            import gradio

            monkeypatch.setattr(gradio.Blocks, "launch", lambda *a, **k: pytest.fail("the demo started"))
        result = run_script(
            SCRIPTS[script], args, capfd, cwd=tmp_path / "workspace", env={"HF_HUB_OFFLINE": "1"}
        )
        return result, before, [snapshot(f) for f in snapshotted]

    return run


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_model_is_one_line_and_changes_nothing(run_case, case):
    result, before, after = run_case(case)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    words = CASES[case][3] if isinstance(CASES[case][3], tuple) else (CASES[case][3],)
    assert len(errors) == 1 and all(w in errors[0] for w in words), result.stderr[-3000:]
    assert errors[0] == result.stderr.strip().splitlines()[-1]
    assert after == before  # the model folder and the workspace: byte-identical, nothing added


# the same guarantees in-process (each also holds through the commands, as above): damaged folder ->
# (what is called with it, the error's words)
IN_PROCESS = {
    "no_weights": ("load", "no_weights/config.json: num_hidden_layers=100000 is above 1,000"),
    "std": ("load", "image_std=[0.0, 0.5, 0.5]; every value must be positive"),
    "adapter_layers": ("load", "adapter/config.json: num_hidden_layers is 100000, but"),
    "auto_map": (
        "stage",
        "auto_map/config.json: auto_map names code that is not vit_ft's (evil/repo--m.Model)",
    ),
    "removed": ("stage", f"removed do not match its config.json (missing keys ['{REMOVED}'])"),
    "code": ("stage", "code/modeling_vit_ft.py differs from the model code of the installed vit_ft"),
}


@pytest.mark.parametrize("name", list(IN_PROCESS))
def test_a_damaged_folder_is_refused_naming_the_file(folders, tmp_path, name):
    from vit_ft.tools.export.hub import stage_for_hub

    call, words = IN_PROCESS[name]
    model = folders[name] / "adapter" if name.startswith("adapter") else folders[name]
    before = snapshot(folders[name])
    with pytest.raises(ValueError) as error:
        if call == "load":
            load_trained(model, device="cpu")
        else:
            stage_for_hub(model, tmp_path / "staged", "me/x", format="vit_ft")
    assert words in str(error.value)
    assert snapshot(folders[name]) == before and not (tmp_path / "staged").exists()


@pytest.mark.parametrize("size", [0, -8])
def test_a_size_that_is_not_positive_says_so(folders, size):
    with pytest.raises(ValueError, match=f"image_size={size}x{size} must be positive"):
        load_trained(folders["good"], device="cpu", image_size=size)


def test_absurd_configs_are_refused_before_any_layer_is_built(folders):
    load_trained(folders["good"], device="cpu")  # imports and caches warm
    for name in ("layers5", "no_weights", "hidden", "adapter_layers"):
        model = folders[name] / "adapter" if name.startswith("adapter") else folders[name]
        start = time.perf_counter()
        with pytest.raises(ValueError, match="config.json: "):
            load_trained(model, device="cpu")
        assert time.perf_counter() - start < 0.5, name


def test_from_pretrained_is_strict_unless_told_otherwise(folders):
    """from_pretrained refuses a vit_ft folder that lacks a tensor, as the tools do; strict=False loads it as new,
    and lists it (tests/model/test_checkpoint_faults.py has the cases)."""
    with pytest.raises(ValueError, match=f"removed/model.safetensors lacks tensors the model needs: {REMOVED}"):
        ViTFTForImageClassification.from_pretrained(folders["removed"])
    model, info = ViTFTForImageClassification.from_pretrained(
        folders["removed"], output_loading_info=True, strict=False
    )
    assert info["missing_keys"] == {REMOVED}
    assert model.loading_report.newly_initialized == [REMOVED.removeprefix("vit.")]


def test_integer_and_non_finite_pixels_are_refused(folders):
    trained: Trained = load_trained(folders["good"], device="cpu")
    with pytest.raises(ValueError, match="pixel_values is torch.uint8: pass float pixels"):
        trained.model(pixel_values=torch.full((1, 3, 16, 16), 128, dtype=torch.uint8))
    pixels = torch.zeros(2, 3, 16, 16)
    assert trained.logits(pixels).shape == (2, 3)
    for bad in (float("nan"), float("inf")):
        pixels[1, 0, 3, 3] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            trained.logits(pixels)


def test_save_pretrained_writes_the_installed_code(tmp_path, folders):
    """A model loaded from a folder with modified code still saves vit_ft's own files."""
    import vit_ft.model as ours

    model = ViTFTForImageClassification.from_pretrained(folders["code"])
    model.save_pretrained(tmp_path / "saved")
    for name in ("modeling_vit_ft.py", "configuration_vit_ft.py", "sizes.py", "pos_embed.py", "rotary.py", "inputs.py",
                 "norms.py", "naflex.py", "knn_head.py", "prompts.py"):
        assert (tmp_path / "saved" / name).read_bytes() == (Path(ours.__file__).parent / name).read_bytes()


def test_push_stages_the_installed_code(tmp_path, folders):
    import vit_ft.model as ours
    from vit_ft.tools.export.hub import stage_for_hub

    staged = stage_for_hub(folders["good"], tmp_path / "staged", "me/x", format="vit_ft")
    for name in ("modeling_vit_ft.py", "configuration_vit_ft.py", "sizes.py", "pos_embed.py", "rotary.py", "inputs.py",
                 "norms.py", "naflex.py", "knn_head.py", "prompts.py"):
        assert (staged / name).read_bytes() == (Path(ours.__file__).parent / name).read_bytes()


def test_hub_processors_never_run_or_ask_for_remote_code(monkeypatch):
    """Every AutoImageProcessor load of a checkpoint says trust_remote_code=False (no prompt mid-run)."""
    import huggingface_hub.constants
    from transformers import AutoImageProcessor

    from vit_ft.model.formats import checkpoint_normalization
    from vit_ft.tools.trained import Origin

    # offline as in CI (HF_HUB_OFFLINE=1 before huggingface_hub is imported): no 20 s of network retries here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    seen = []

    def fake(name, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise OSError("not here")

    monkeypatch.setattr(AutoImageProcessor, "from_pretrained", staticmethod(fake))
    assert Origin("someone/model").processor is None
    assert checkpoint_normalization("someone/model") == {}
    assert seen == [False, False]


def test_a_fine_tune_from_a_missing_path_says_so(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from huggingface_hub import constants

    from vit_ft.arguments.fields import ModelArguments
    from vit_ft.commands.model_flags import check_sources

    def sources(model_args, dataset_name=None, teacher=None):
        data = SimpleNamespace(dataset_name=dataset_name)
        check_sources(model_args, data, SimpleNamespace(teacher_model_name_or_path=teacher))

    with pytest.raises(FileNotFoundError, match="/missing/path: no such folder"):
        sources(ModelArguments(model_name_or_path=str(tmp_path / "missing" / "path")))
    with pytest.raises(FileNotFoundError, match=r"^teacher_model_name_or_path \./teacher: no such folder"):
        sources(ModelArguments(model_name_or_path=str(tmp_path)), teacher="./teacher")
    with pytest.raises(FileNotFoundError, match=r"^dataset_name me/dogz: no such folder, and offline mode"):
        sources(ModelArguments(model_name_or_path=str(tmp_path)), dataset_name="me/dogz")
    sources(ModelArguments(model_name_or_path=str(tmp_path)), dataset_name="imagefolder")  # a datasets builder
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("vit_ft.utils.hub_ids.check_hub_reachable", lambda *a, **k: None)  # online: asked once
    sources(ModelArguments(model_name_or_path="google/vit-base-patch16-224-in21k"))  # a Hub id
    # the built-in pre-training creates it
    sources(ModelArguments(model_name_or_path=str(tmp_path / "pre"), pretrain_if_missing="digits"))
