"""The output-folder guard, in one place: before a command writes into a folder, refuse what it must not
write into (a file, an input it reads, a finished fine-tune it would replace, any existing folder), with
one message that names the fix. Each command states which of these apply (`check_output_dir`'s arguments);
the fine-tune, the sweep, few-shot and the Hub staging use it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from .run_record import is_finished


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output_dir(
    output_dir: str | os.PathLike,
    *,
    flag: str = "--output_dir",
    holds: str | None = None,
    inputs: Sequence[str | os.PathLike] = (),
    finished: str | Callable[[Path], str | None] | None = None,
    new: str | None = None,
) -> Path:
    """Refuse an output folder this command must not write into; returns it as a Path.

    Always refused: a file (NotADirectoryError); `holds` names what the folder is for ("fewshot.md, ...").
    As the caller asks (`flag` is how the user named the folder):
    - inputs: a folder that is, or lies inside, one of these existing input folders (ValueError): the command
      would write among what it reads. The returned path is then resolved.
    - finished: a folder holding a finished fine-tune (`run_record.is_finished`) (FileExistsError).
      `finished` is the rest of the message, what would be replaced and the flags that allow it, or a
      function of the folder returning that (None: allowed).
    - new: anything that exists at `output_dir` (FileExistsError); `new` is the fix to name.
    """
    text = os.fspath(output_dir)
    path = Path(output_dir).expanduser()
    if inputs:
        path = path.resolve()
        for value in inputs:
            folder = Path(value).expanduser()
            if folder.is_dir() and _inside(path, folder.resolve()):
                raise ValueError(
                    f"{flag} {text} is inside the input folder {value}; pass a folder outside it."
                )
    if new is not None and path.exists():
        raise FileExistsError(f"{text} exists; {new}.")
    if path.exists() and not path.is_dir():
        fix = f"pass a folder for {holds}" if holds else f"pass another {flag}"
        raise NotADirectoryError(f"{flag} {text} is a file, not a folder; {fix}.")
    if finished is not None and is_finished(path):
        reason = finished(path) if callable(finished) else finished
        if reason is not None:
            raise FileExistsError(f"{text} holds a finished {reason}")
    return path


__all__ = ["check_output_dir"]
