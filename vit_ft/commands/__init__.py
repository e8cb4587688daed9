"""The entry points: `vit-ft <command> [flags]` (also `python -m vit_ft <command>`), one module per command.

    vit-ft finetune --recipe digits
    vit-ft predict --model outputs/digits IMAGE ...
    vit-ft <command> --help

Each command is `vit_ft.commands.<command>.main(argv)`, also runnable as `python -m vit_ft.commands.<command>`
(and `accelerate launch -m vit_ft.commands.finetune`); `scripts/*.py` are thin wrappers over the same mains. A
command's module is imported only when it runs, so `vit-ft predict` does not load the training code, and its
`--model` is checked before that (`model_flags`: a missing folder fails at once).
"""

from __future__ import annotations

import difflib
import importlib
import sys

PROG = "vit-ft"
# command -> what it does (the help's list); the module vit_ft.commands.<command> has main(argv)
COMMANDS = {
    "finetune": "fine-tune a ViT from a recipe (--list-recipes lists them)",
    "seeds": "the same fine-tune under several seeds, summarised",
    "evaluate": "evaluate a trained model: metrics, per-class table, confusion matrix, mistakes",
    "predict": "classify images with a trained model",
    "inspect": "attention maps and rollout of a trained model",
    "fewshot": "the few-shot linear probe of the ViT paper",
    "audit": "find wrong labels, duplicates, train/test leaks and outliers in a dataset",
    "push": "push a fine-tune output folder to the Hugging Face Hub",
    "export": "export a trained model to ONNX (and int8) for onnxruntime",
    "serve": "serve a trained model over HTTP with dynamic batching",
    "wise": "WiSE-FT: interpolate a zero-shot model and its fine-tune (alpha chosen on validation)",
    "bench": "the VTAB-1k / FGVC benchmark: fine-tuning methods x tasks under the paper protocol, one table",
}


def usage() -> str:
    """The top-level help: how to call a command, and every command with what it does."""
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: {PROG} <command> [flags]   ({PROG} <command> --help for a command's flags)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run `vit-ft <command> ARGS` as `vit_ft.commands.<command>.main(ARGS)`; a wrong command is one `error:` line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown command {argv[0]!r}" if argv else "no command given"
        close = difflib.get_close_matches(argv[0], list(COMMANDS), n=1) if argv else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(
            f"error: {given}{hint}. Run {PROG} <command> [flags] with one of: {', '.join(COMMANDS)} "
            f"(e.g. {PROG} finetune --recipe digits).",
            file=sys.stderr,
        )
        sys.exit(1)
    name, rest = argv[0], argv[1:]
    if sys.argv[1:] == argv:  # run as the command: its --help and usage lines name it as the user typed it
        sys.argv = [f"{PROG} {name}", *rest]
    if not {"-h", "--help", "--help-all"} & set(rest):
        _check_model_first(rest)
    importlib.import_module(f"{__name__}.{name}").main(rest)


def _check_model_first(argv: list[str]) -> None:
    """The command's --model checked before the command (and torch) is imported: a mistyped folder fails in
    well under a second (`model_flags`), as the one `error:` line `cli.run_tool` prints."""
    from ..utils.cli import USER_ERRORS, run_tool
    from .model_flags import check_model_flags

    try:
        check_model_flags(argv)
    except USER_ERRORS:
        run_tool(lambda _: check_model_flags(argv), argv)  # prints the line (or, with --debug, the traceback)


__all__ = ["COMMANDS", "main", "usage"]
