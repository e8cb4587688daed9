"""vit_ft.commands.finetune: the fine-tune's own switches (--recipe, --resume, --overwrite_output_dir, --sweep,
--list-recipes, --help) read once, everything else kept in order for parse_args."""

import pytest

from vit_ft.arguments.command_line import given_as_flag
from vit_ft.arguments.recipes import RecipeError
from vit_ft.commands.finetune import parse_command


def test_the_on_off_switch_reads_its_three_spellings():
    flag = "overwrite_output_dir"

    def read(argv):
        command = parse_command(argv)
        return command.overwrite_output_dir, list(command.flags)

    assert read(["--recipe", "x", f"--{flag}"]) == (True, ["--recipe", "x"])
    assert read([f"--{flag}", "false", "--seed", "1"]) == (False, ["--seed", "1"])
    assert read([f"--{flag}=true"]) == (True, [])
    assert read(["--seed", "1"]) == (False, ["--seed", "1"])
    with pytest.raises(RecipeError, match="not true or false"):
        parse_command([f"--{flag}=maybe"])


def test_sweep_is_taken_in_both_spellings_and_only_once():
    command = parse_command(["--recipe", "r", "--sweep", "seed=1,2", "--x"])
    assert (command.sweep, command.flags) == ("seed=1,2", ("--recipe", "r", "--x"))
    assert (parse_command(["--sweep=seed=1,2"]).sweep, parse_command(["--sweep=seed=1,2"]).flags) == (
        "seed=1,2",
        (),
    )
    command = parse_command(["--recipe", "r"])
    assert (command.sweep, command.flags) == (None, ("--recipe", "r"))
    with pytest.raises(RecipeError, match="one --sweep"):
        parse_command(["--sweep", "seed=1", "--sweep", "learning_rate=1"])
    with pytest.raises(RecipeError, match="needs a value"):
        parse_command(["--sweep"])
    with pytest.raises(RecipeError, match="needs a value"):
        parse_command(["--sweep", "--resume"])


def test_resume_becomes_the_last_checkpoint_and_the_recipe_is_named():
    command = parse_command(["--recipe", "recipes/dogs-lora.yaml", "--learning_rate", "-0.1", "--resume"])
    assert command.recipe == "dogs-lora"
    assert command.flags == (
        "--recipe", "recipes/dogs-lora.yaml", "--learning_rate", "-0.1", "--resume_from_checkpoint", "last",
    )  # fmt: skip
    assert command.gives("resume") and command.gives("resume_from_checkpoint") and command.gives("recipe")
    assert not command.gives("sweep") and not command.gives("overwrite_output_dir")
    assert parse_command(["--overwrite_output_dir", "false"]).gives(
        "overwrite_output_dir"
    )  # given, though off


def test_given_as_flag_knows_every_spelling():
    assert given_as_flag(["--seed", "1"], "seed") and given_as_flag(["--seed=1"], "seed")
    assert given_as_flag(["--no_use_lora"], "use_lora") and not given_as_flag(["--seeds", "1"], "seed")


def test_the_command_parses_into_the_argument_dataclasses():
    model_args, _, training_args = parse_command(["--recipe", "digits", "--resume"]).parse()
    assert model_args.image_size == 32 and training_args.resume_from_checkpoint == "last"
