"""The run plan (`arguments.plan`): every merged value with its source, the data source, the input spec, the batch
split, the output folder's state and the passes; `--print_plan` shows it and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vit_ft.arguments.plan import SOURCES
from vit_ft.arguments.recipes import build_plan, load_recipe, resolve_recipe

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe
from .test_recipes import _cpu_flags


@pytest.mark.parametrize(
    ("recipe", "data", "inputs"),
    [
        ("digits", "built-in digits", "square 32x32 px"),
        ("dogs", "Hub dataset", "square 384x384 px"),
        ("imagenet1k", "(streamed)", "square"),  # a streaming recipe
        ("pets-siglip2", "Hub dataset", "NaFlex: up to"),  # a NaFlex recipe
    ],
)
def test_print_plan_shows_the_plan_and_writes_nothing(recipe, data, inputs, tmp_path, capfd):
    result = run_script("scripts/finetune.py", ["--recipe", recipe, *_cpu_flags(recipe), "--print_plan"], capfd,
                        cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith(f"Run plan (recipe {recipe})") and data in out and inputs in out, out[:1500]
    for line in ("  data:", "  inputs:", "  task:", "  method:", "  batch:   global", "  outputs:", "feature bank:"):
        assert line in out, line
    assert list(tmp_path.iterdir()) == []  # no data written, no output folder, no model built


def test_each_value_names_the_layer_it_came_from(tmp_path):
    recipe = write_tiny_recipe(tmp_path)
    plan = build_plan(["--recipe", str(recipe), "--learning_rate", "0.01", "--global_batch_size", "32"])
    recipe_values = load_recipe(resolve_recipe(str(recipe)))
    assert plan.values["learning_rate"] == 0.01 and plan.sources["learning_rate"] == "flag"
    assert plan.sources["image_size"] == "recipe" and plan.values["image_size"] == recipe_values["image_size"]
    # 32 global / 16 per device on one process: the accumulation is the merge's, given by no layer
    assert plan.values["gradient_accumulation_steps"] == 2 and plan.sources["gradient_accumulation_steps"] == "derived"
    assert plan.batch["global_batch"] == 32 == plan.training_args.per_device_train_batch_size * 2
    assert set(plan.sources.values()) <= set(SOURCES)
    assert plan.values.keys() == plan.sources.keys()


def test_the_output_folder_state_and_the_bank_pass_follow_the_run(tmp_path):
    recipe = write_tiny_recipe(tmp_path)
    plan = build_plan(["--recipe", str(recipe)])
    assert plan.outputs.endswith(": new")
    (tmp_path / "out" / "checkpoint-4").mkdir(parents=True)
    assert "1 checkpoint(s)" in build_plan(["--recipe", str(recipe)]).outputs
    names = [one.name for one in plan.passes]
    assert names.index("evaluation") < names.index("feature bank") and "test evaluation" in names
    probe = build_plan(["--recipe", str(recipe), "--method", "linear"])
    assert "probe features" in [one.name for one in probe.passes]


def test_the_run_record_keeps_the_plan(tiny_finetuned_dir: Path):
    record = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())
    plan = record["plan"]
    assert plan["method"] == "full" and plan["sources"]["learning_rate"] == "recipe"
    assert plan["batch"]["per_device_train_batch_size"] == 16
    assert "feature bank" in [one["name"] for one in plan["passes"]]


@pytest.mark.parametrize(
    ("flags", "size"),
    [
        ([], "up to 96 images"),  # the tiny recipe's max_train_samples
        (["--max_steps", "2"], "up to 32 images"),  # a smoke run: 2 steps x 16 images
        (["--bank_max_images", "20"], "up to 20 images"),
        (["--bank_max_images", "none"], "predict, evaluate and the demo will not flag"),
    ],
)
def test_the_plan_sizes_the_bank_as_the_run_will(flags, size, tmp_path):
    recipe = write_tiny_recipe(tmp_path)
    bank = {one.name: one for one in build_plan(["--recipe", str(recipe), *flags]).passes}["feature bank"]
    assert bank.size.startswith(size) and bank.key == "bank_max_images", bank


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_the_plan_holds_the_compute_decision(native, tmp_path, monkeypatch):
    """Issue 53: device, precision and kernels are one field of the plan, forced both ways here."""
    from vit_ft.utils import hardware

    monkeypatch.setattr(hardware, "onednn_bf16_supported", lambda: native)
    plan = build_plan(["--recipe", str(write_tiny_recipe(tmp_path)), "--bf16", "true", "--use_cpu", "true"])
    record = plan.record()["compute"]
    assert record == plan.compute.record() and plan.compute.precision == "bf16"
    assert plan.compute.emulated_bf16 is (not native)
    assert ("emulated" in plan.describe()) is (not native)


def _no_network(*args, **kwargs):
    raise AssertionError("--print_plan asked the Hub")


def test_print_plan_refuses_a_mistyped_local_model_folder_in_one_line(tmp_path, capfd, monkeypatch):
    """The review finding: the plan ran no path check, so it showed a model folder that does not exist."""
    monkeypatch.setattr("vit_ft.utils.hub_ids.check_hub_reachable", _no_network)
    (tmp_path / "outputs" / "digits-pretrained").mkdir(parents=True)
    result = run_script("scripts/finetune.py", ["--recipe", "digits", "--model_name_or_path",
                        "outputs/digits-pretraned", "--print_plan"], capfd, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and "Run plan" not in result.stdout, result.stdout[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: model_name_or_path outputs/digits-pretraned: no such folder; did you mean outputs/digits-pretrained?"
    ]


@pytest.mark.parametrize("flag", ["--teacher_model_name_or_path", "--model_name_or_path"])
def test_print_plan_refuses_a_missing_local_model_or_teacher(flag, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr("vit_ft.utils.hub_ids.check_hub_reachable", _no_network)
    recipe = write_tiny_recipe(tmp_path)
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe), flag, str(tmp_path / "backbne"),
                        "--print_plan"], capfd, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag.lstrip('-')} {tmp_path / 'backbne'}: no such folder; did you mean")


@pytest.mark.parametrize("offline", ["1", "0"], ids=["HF_HUB_OFFLINE=1", "online"])
def test_print_plan_states_an_uncached_hub_id_unchecked_without_asking_the_hub(offline, tmp_path, capfd, monkeypatch):
    """A Hub id the cache does not hold is neither looked up nor refused: the plan prints and says so (offline
    mode: that the run will refuse it)."""
    monkeypatch.setattr("vit_ft.utils.hub_ids.check_hub_reachable", _no_network)
    result = run_script("scripts/finetune.py", ["--recipe", "dogs", *_cpu_flags("dogs"), "--print_plan"], capfd,
                        cwd=tmp_path, env={"HF_HUB_OFFLINE": offline})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    recipe = load_recipe(resolve_recipe("dogs"))
    unchecked = [line for line in result.stdout.splitlines() if line.startswith("  not checked: ")]
    assert [line.split(":")[1].strip() for line in unchecked] == [
        f"model_name_or_path {recipe['model_name_or_path']}",
        f"dataset_name {recipe['dataset_name']}",
    ]
    assert all(("the run will refuse it" in line) is (offline == "1") for line in unchecked), unchecked
    assert list(tmp_path.iterdir()) == []


def test_a_plan_whose_sources_are_here_states_nothing_unchecked(tmp_path):
    plan = build_plan(["--recipe", str(write_tiny_recipe(tmp_path))])
    assert "not checked" not in plan.describe()
    assert "  not checked: x: why" in plan.describe(["x: why"]).splitlines()


def test_print_plan_imports_neither_the_training_layer_nor_the_tasks(tmp_path):
    """What keeps `--print_plan` near the cost of importing transformers' TrainingArguments: the training layer,
    the tasks package and datasets stay unimported."""
    code = (
        "import sys\nfrom vit_ft.commands.finetune import main\n"
        "try:\n    main(['--recipe', 'digits', '--print_plan'])\nexcept SystemExit as stop:\n    assert not stop.code\n"
        "loaded = [name for name in ('vit_ft.training', 'vit_ft.tasks', 'datasets') if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("Run plan (recipe digits)")
