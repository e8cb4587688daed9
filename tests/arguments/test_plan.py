"""The run plan (`arguments.plan`): every merged value with its source, the data source, the input spec, the batch
split, the output folder's state and the passes; `--print_plan` shows it and writes nothing."""

from __future__ import annotations

import json
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
