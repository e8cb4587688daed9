"""The fine-tune's short `--help`: vit-ft's own flags (the argument dataclasses' fields, each a recipe key) with the
first sentence of their help, read from the dataclasses' source without importing them, so that `--help`
answers in well under a second (the dataclasses import torch and transformers; the full help, Trainer's hundred
flags included, is `--help-all`).

The source is the one place: each field's name and help as the dataclass declares it, `name: type = option(default,
"help")` (`option`: a dataclass field with its help, as HfArgumentParser reads it; a test checks the names against
the classes themselves).
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
# (heading, source file, class): the groups of the short help, in order
SECTIONS = (
    ("model", "fields.py", "ModelArguments"),
    ("VPT (method vpt)", "prompt_arguments.py", "PromptArguments"),
    ("data", "fields.py", "DataArguments"),
    ("augmentation", "augmentation_arguments.py", "AugmentationArguments"),
    ("passes after training", "pass_arguments.py", "PassArguments"),
    ("training (vit-ft's own; Trainer's in --help-all)", "training_arguments.py", "FineTuneTrainingArguments"),
)
# the Trainer flags a first run changes most (all of TrainingArguments' are under --help-all)
COMMON_TRAINER_FLAGS = (
    "output_dir",
    "num_train_epochs",
    "max_steps",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "weight_decay",
    "warmup_steps",
    "seed",
    "bf16",
    "dataloader_num_workers",
    "eval_strategy",
    "save_strategy",
    "push_to_hub",
    "hub_model_id",
    "report_to",
    "disable_tqdm",
)


def option(default: Any, text: str, **kwargs: Any) -> Any:
    """A field of an argument dataclass: its default and its help `text` (the flag's help in `--help-all`, the
    first sentence of it in the short help); `kwargs` go to `dataclasses.field` as they are."""
    return dataclasses.field(default=default, metadata={"help": text}, **kwargs)


def _string(node: ast.expr) -> str:
    """A string literal as written (an f-string's placeholders as '...'), or ""."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "..." for part in node.values)
    return ""


def _help_text(call: ast.Call) -> str:
    """The help of an `option(default, "help")` call, or the `metadata={"help": ...}` of a `field(...)` call, as
    written, or ""."""
    if isinstance(call.func, ast.Name) and call.func.id == "option":
        if len(call.args) > 1:
            return _string(call.args[1])
        return next((_string(keyword.value) for keyword in call.keywords if keyword.arg == "text"), "")
    for keyword in call.keywords:
        if keyword.arg == "metadata" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "help":
                    return _string(value)
    return ""


def declared_fields(source: str | Path, class_name: str) -> list[tuple[str, str]]:
    """(name, help) of each `name: type = field(...)` the class declares itself, in order."""
    tree = ast.parse(Path(HERE / source).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                (item.target.id, _help_text(item.value) if isinstance(item.value, ast.Call) else "")
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise LookupError(f"no class {class_name} in {source}")


# a sentence ends at ". " that no "e.g." / "i.e." makes and that no bracket is still open around
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and text[i + 1 : i + 2] == " " and depth <= 0 and not text[:i].endswith(_ABBREVIATIONS):
            return text[: i + 1]
    return text


def _rows(rows: list[tuple[str, str]], width: int) -> list[str]:
    """`  --flag   help` lines: the flag column as wide as the longest flag; a help longer than the line ends in
    '...' (the whole text is in --help-all)."""
    column = max(len(flag) for flag, _ in rows) + 4
    room = max(width - column, 30)
    return [
        f"  {flag:<{column - 2}}{textwrap.shorten(text, room, placeholder=' ...') if text else ''}".rstrip()
        for flag, text in rows
    ]


def short_help(prog: str, usage: str, description: str, switches: list[tuple[str, str]]) -> str:
    """The short help: usage, description, the command's `switches` ((flag, help) pairs), each section of vit-ft's
    own flags with the first sentence of its help, and the Trainer flags used most."""
    width = min(shutil.get_terminal_size((110, 24)).columns, 110)
    lines = [f"usage: {prog} {usage}", "", *textwrap.wrap(description, width), "", "the command:"]
    lines += _rows(switches, width)
    for heading, source, class_name in SECTIONS:
        rows = [(f"--{name}", _first_sentence(text)) for name, text in declared_fields(source, class_name)]
        lines += ["", f"{heading}:", *_rows(rows, width)]
    trainer = " ".join(f"--{name}" for name in COMMON_TRAINER_FLAGS)
    lines += ["", "Trainer's, used most (each with its help, and every other, in --help-all):"]
    lines += textwrap.wrap(trainer, width, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


__all__ = ["COMMON_TRAINER_FLAGS", "SECTIONS", "declared_fields", "option", "short_help"]
