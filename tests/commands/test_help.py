"""`vit-ft finetune --help` is short and fast: vit-ft's own flags first (read from the argument dataclasses'
source by `arguments.help`, never importing torch or transformers), the Trainer's under `--help-all`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from transformers import TrainingArguments

from vit_ft.arguments import command_line
from vit_ft.arguments.augmentation_arguments import AugmentationArguments
from vit_ft.arguments.fields import DataArguments, ModelArguments
from vit_ft.arguments.help import COMMON_TRAINER_FLAGS, SECTIONS, declared_fields
from vit_ft.arguments.pass_arguments import PassArguments
from vit_ft.arguments.prompt_arguments import PromptArguments
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments
from vit_ft.commands import finetune
from vit_ft.commands.finetune import parse_command

from ..conftest import REPO

# each short-help section's class and the parents whose fields it does not declare itself
OWN = {
    "ModelArguments": (ModelArguments, (PromptArguments,)),
    "PromptArguments": (PromptArguments, ()),
    "DataArguments": (DataArguments, (AugmentationArguments, PassArguments)),
    "AugmentationArguments": (AugmentationArguments, ()),
    "PassArguments": (PassArguments, ()),
    "FineTuneTrainingArguments": (FineTuneTrainingArguments, (TrainingArguments,)),
}


@pytest.mark.parametrize("source, class_name", [(source, name) for _, source, name in SECTIONS])
def test_the_short_help_reads_each_dataclass_own_fields_and_help(source, class_name):
    cls, parents = OWN[class_name]
    inherited = {f.name for parent in parents for f in dataclasses.fields(parent)}
    own = [f for f in dataclasses.fields(cls) if f.name not in inherited]
    declared = declared_fields(source, class_name)
    assert [name for name, _ in declared] == [f.name for f in own]
    for (name, text), item in zip(declared, own, strict=True):
        if "..." not in text:  # an f-string's placeholders are shown as "..."
            assert text == item.metadata["help"], name


def test_the_command_spells_its_switches_as_the_parser_does():
    assert finetune.SWEEP_FLAG == command_line.SWEEP_FLAG
    assert finetune.PROCESS_PER_RUN_FLAG == command_line.PROCESS_PER_RUN_FLAG
    trainer = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(COMMON_TRAINER_FLAGS) <= trainer


def test_help_all_lists_every_trainer_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command(["--help-all"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--logging_steps" in out and "--lr_scheduler_type" in out and "--recipe" in out


def help_in_a_fresh_process(command: str, cwd) -> tuple[str, list[str]]:
    """`vit-ft COMMAND --help` in a fresh interpreter: its output, and whether torch and transformers were imported.
    The process boundary is the point: what a fresh `--help` imports."""
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['vit-ft', {command!r}, '--help']\n"
        "try:\n    runpy.run_module('vit_ft', run_name='__main__')\n"
        "finally:\n    print('IMPORTED', 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    help_text, _, imported = ran.stdout.rpartition("IMPORTED")
    return help_text, imported.split()


@pytest.mark.parametrize("command", ["predict", "evaluate", "inspect", "fewshot", "export", "seeds", "push", "audit"])
def test_a_tool_help_imports_neither_torch_nor_transformers(tmp_path, command):
    help_text, imported = help_in_a_fresh_process(command, tmp_path)
    assert imported == ["False", "False"]
    assert help_text.startswith(f"usage: vit-ft {command}") and "--help" in help_text


def test_finetune_help_is_short_and_imports_neither_torch_nor_transformers(tmp_path):
    help_text, imported = help_in_a_fresh_process("finetune", tmp_path)
    assert imported == ["False", "False"]
    assert len(help_text.splitlines()) < 150
    lines = help_text.splitlines()
    assert lines[0].startswith("usage: vit-ft finetune --recipe")
    for flag in ("--recipe NAME", "--resume", "--sweep ARG=V1,V2,...", "--help-all", "--model_name_or_path",
                 "--layer_decay", "--learning_rate"):  # fmt: skip
        assert flag in help_text, flag
    # vit-ft's own flags come first, the Trainer's (a few named, the rest under --help-all) last
    assert help_text.index("--recipe") < help_text.index("--layer_decay") < help_text.index("--learning_rate")
    assert "--logging_steps" not in help_text
