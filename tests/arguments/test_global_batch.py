"""`global_batch_size`, the recipe's contract: the accumulation derived from the world size where the arguments
are built (`global_batch.resolve_global_batch`), refused in one line when it does not divide or when an
explicit accumulation disagrees, checked once against the batch Trainer takes (`checks.check_global_batch`), and
stated in one log line (`describe_batch`) and the run record (`batch_record`)."""

import types

import pytest
from transformers import TrainingArguments

from vit_ft.arguments.checks import RecipeError, check_global_batch
from vit_ft.arguments.global_batch import (
    batch_record,
    describe_batch,
    launch_world_size,
    resolve_global_batch,
)
from vit_ft.arguments.recipes import load_recipe, parse_args, resolve_recipe
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments

# (world size, per-device batch, global batch, the accumulation that makes it)
DIVIDES = [(1, 8, 64, 8), (2, 8, 64, 4), (4, 8, 64, 2), (4, 16, 64, 1), (2, 16, 64, 2), (8, 32, 512, 2),
           (1, 32, 512, 16), (3, 8, 48, 2)]  # fmt: skip
# (world size, per-device batch, global batch, what the one line suggests)
REFUSED = [
    (3, 8, 64, "a number of processes that divides 64"),  # 64 is no multiple of 3 at any per-device batch
    (4, 32, 64, "--per_device_train_batch_size 16"),  # 128 a step already
    (1, 48, 64, "--per_device_train_batch_size 32"),
    (2, 16, 48, "--per_device_train_batch_size 12"),  # the largest that divides: 48 = 12 x 2 x 2
]


@pytest.mark.parametrize(("world", "per_device", "total", "accumulation"), DIVIDES)
def test_the_accumulation_is_derived_from_the_world_size(world, per_device, total, accumulation):
    values = {"per_device_train_batch_size": per_device, "global_batch_size": total}
    resolved = resolve_global_batch(values, set(values), world_size=world)
    assert resolved["gradient_accumulation_steps"] == accumulation
    assert per_device * world * resolved["gradient_accumulation_steps"] == total
    # an explicit accumulation that agrees is kept; the input is not changed
    agreeing = {**values, "gradient_accumulation_steps": accumulation}
    assert resolve_global_batch(agreeing, set(agreeing), world_size=world) == resolved
    assert "gradient_accumulation_steps" not in values


@pytest.mark.parametrize(("world", "per_device", "total", "fix"), REFUSED)
def test_a_global_batch_that_does_not_divide_is_one_line(world, per_device, total, fix):
    values = {"per_device_train_batch_size": per_device, "global_batch_size": total}
    with pytest.raises(RecipeError) as error:
        resolve_global_batch(values, set(values), world_size=world)
    message = str(error.value)
    assert "\n" not in message and f"global_batch_size={total} is not a multiple" in message
    assert f"{per_device} x {world} process" in message and fix in message


@pytest.mark.parametrize(("world", "stated"), [(1, 1), (2, 8), (4, 1), (4, 3)])
def test_an_explicit_accumulation_that_disagrees_is_one_line(world, stated):
    values = {"per_device_train_batch_size": 8, "global_batch_size": 64, "gradient_accumulation_steps": stated}
    with pytest.raises(RecipeError) as error:
        resolve_global_batch(values, set(values), world_size=world)
    message = str(error.value)
    assert "\n" not in message
    assert f"gradient_accumulation_steps={stated} disagrees with global_batch_size=64" in message
    assert f"needs {64 // (8 * world)}" in message and f"--global_batch_size {8 * world * stated}" in message


def test_unset_keeps_todays_behaviour():
    values = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 3}
    assert resolve_global_batch(values, set(values), world_size=4) == values
    # not given (the default): derived, whatever the default's value
    assert resolve_global_batch({"global_batch_size": 16, "gradient_accumulation_steps": 1}, set(), 1)[
        "gradient_accumulation_steps"
    ] == 2  # TrainingArguments' per-device default is 8


def test_the_world_size_is_the_launchs():
    assert launch_world_size({"WORLD_SIZE": "4"}) == 4
    assert launch_world_size({}) == 1  # no launcher, no accelerate state set up in this process


def test_a_recipe_flag_and_python_reach_the_same_global_batch_as_transformers_counts_it(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _, _, args = parse_args(["--recipe", "digits", "--global_batch_size", "64", "--per_device_train_batch_size", "16"])
    assert args.gradient_accumulation_steps == 4  # the recipe's accumulation (1) replaced by the flag's global
    # transformers' own count of the batch one optimizer step sees
    assert args.train_batch_size * args.gradient_accumulation_steps * args.world_size == 64
    assert batch_record(args) == {"world_size": 1, "per_device_train_batch_size": 16,
                                  "gradient_accumulation_steps": 4, "global_batch": 64, "global_batch_size": 64}  # fmt: skip
    line = describe_batch(args)
    assert line.startswith("Batch: global 64 = 16 per device x 1 process (world size) x 4 accumulation steps")
    assert "global_batch_size: 64" in line
    # an accumulation flag beside it must agree
    with pytest.raises(RecipeError, match=r"^gradient_accumulation_steps=2 disagrees with global_batch_size=64"):
        parse_args(["--recipe", "digits", "--global_batch_size", "64", "--per_device_train_batch_size", "16",
                    "--gradient_accumulation_steps", "2"])  # fmt: skip
    # without one, today's batch: per device x processes x accumulation
    _, _, plain = parse_args(["--recipe", "digits"])
    assert plain.global_batch_size is None and "grows with the number of processes" in describe_batch(plain)


@pytest.mark.parametrize("name", ["dogs", "imagenet1k", "cifar10-lora", "hymenoptera"])
def test_the_gpu_recipes_state_their_global_batch(name, monkeypatch):
    values = load_recipe(resolve_recipe(name))
    assert "gradient_accumulation_steps" not in values  # derived, so it cannot go stale
    total, per_device = values["global_batch_size"], values["per_device_train_batch_size"]
    for world in (1, 2, 4, 8):
        if total % (per_device * world) == 0:
            resolved = resolve_global_batch(values, set(values), world_size=world)
            assert per_device * world * resolved["gradient_accumulation_steps"] == total


def test_arguments_built_in_python_are_checked_against_trainers_world_size(tmp_path):
    args = FineTuneTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, global_batch_size=64,
                                     gradient_accumulation_steps=4, use_cpu=True, report_to=[])  # fmt: skip
    with pytest.raises(RecipeError, match=r"global_batch_size=64 but 8 per device x 1 process x 4 .* make 32"):
        check_global_batch(args)
    args.gradient_accumulation_steps = 8
    check_global_batch(args)
    check_global_batch(TrainingArguments(output_dir=str(tmp_path), use_cpu=True))  # no global batch: nothing


@pytest.mark.parametrize("value", ["0", "-64"])
def test_a_bad_global_batch_is_its_ranges_line(value):
    with pytest.raises(RecipeError, match=r"global_batch_size=.* must be a positive integer"):
        parse_args(["--recipe", "digits", "--global_batch_size", value])


def test_one_process_driving_several_gpus_is_counted_as_transformers_counts_it():
    """DataParallel (a plain `python` run on a machine with 2 GPUs): train_batch_size is 8 x 2, so the derived
    accumulation would double the batch; refused with the launch that fixes it (args stand in for the GPUs')."""
    args = types.SimpleNamespace(global_batch_size=32, per_device_train_batch_size=8, train_batch_size=16, n_gpu=2,
                                 world_size=1, gradient_accumulation_steps=4)  # fmt: skip
    with pytest.raises(RecipeError, match=r"drives 2 GPUs \(DataParallel\), so a step would see 64 images; launch"):
        check_global_batch(args)
    assert batch_record(args)["global_batch"] == 64
    args.gradient_accumulation_steps = 2
    check_global_batch(args)
