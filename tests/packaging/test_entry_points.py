"""vit_ft.commands: `vit-ft <command>` dispatches to vit_ft.commands.<command>.main; a wrong command is one line."""

import importlib
import subprocess
import sys

import pytest

from vit_ft.arguments.recipes import list_recipes
from vit_ft.commands import COMMANDS, main


def test_every_command_has_a_main():
    for name in COMMANDS:
        assert callable(importlib.import_module(f"vit_ft.commands.{name}").main), name


@pytest.mark.parametrize(("argv", "words"), [(["finetun"], "unknown command 'finetun' (did you mean 'finetune'?)"),
                                             ([], "no command given")])  # fmt: skip
def test_a_wrong_command_is_one_error_line_listing_the_commands(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {words}")
    assert all(name in lines[0] for name in COMMANDS)


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in COMMANDS)


def test_a_command_gets_the_rest_of_the_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["finetune", "--list-recipes"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"\n{name} " in out for name in list_recipes())


@pytest.mark.slow
def test_python_dash_m_vit_ft_runs_a_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "vit_ft", "finetune", "--recipe", "digits", "--learning_rat", "0.1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: Unknown flag '--learning_rat' (not a field of ModelArguments, DataArguments or TrainingArguments); "
        "did you mean --learning_rate?"
    ]
    assert not (tmp_path / "outputs").exists()
