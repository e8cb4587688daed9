"""The output-folder guard, in one place: before a command writes into a folder, refuse what it must not
write into (a file, an input it reads, a finished fine-tune it would replace, any existing folder), with
one message that names the fix. Each command states which of these apply (`check_output_dir`'s arguments);
the fine-tune, the sweep, few-shot and the Hub staging use it.

And the rule that keeps a user's files in a folder a command writes into (`OutputFiles`: export, evaluate,
inspect, few-shot): the command replaces only its own files, never the folder's others.

    EXPORT = OutputFiles("export", ("model.onnx", "config.json", ...), "export", own_needs_overwrite=True)
    EXPORT.check(folder, overwrite)                  # before the model loads: refused as the rule says
    with EXPORT.staged(folder, overwrite) as staging:  # write the files into `staging` ...
        ...                                          # ... moved into `folder` when the block ends
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .files import disk_full_error, is_disk_full, write_text_atomically
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


OUTPUT_RECORD = ".vit_ft_outputs.json"  # in the folder: {command: [the files it wrote there]}


def written_by(folder: str | os.PathLike, command: str) -> set[str]:
    """The files (relative names) `command` wrote into `folder`, as the folder's OUTPUT_RECORD says; an absent
    or unreadable record: none (the files there are then the user's)."""
    try:
        record = json.loads((Path(folder) / OUTPUT_RECORD).read_text(encoding="utf-8"))
        names = record.get(command, [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {name for name in names if isinstance(name, str)} if isinstance(names, list) else set()


def record_outputs(folder: str | os.PathLike, command: str, names: Iterable[str]) -> None:
    """Record `names` as the files `command` wrote into `folder` (OUTPUT_RECORD, written atomically; the
    entries of other commands kept)."""
    path = Path(folder) / OUTPUT_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    record = record if isinstance(record, dict) else {}
    record[command] = sorted(set(names))
    write_text_atomically(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _files_in(folder: Path) -> list[str]:
    """Every file under `folder`, as names relative to it (`a/b.png`)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


@dataclass(frozen=True)
class OutputFiles:
    """The files one command writes into its output folder, and the rule that keeps the user's there:

    - a file of the folder that is not one of `names` is never touched;
    - one of `names` that the command wrote there (the folder's OUTPUT_RECORD lists it) is replaced; with
      `own_needs_overwrite` (export: an earlier export is replaced only when asked) only with --overwrite;
    - one of `names` that the command did not write (the user's, or written before the record was kept) is
      replaced only with --overwrite; else refused, naming the files and the fix, before anything loads;
    - the command's files of an earlier run that this run does not write again (an int8 graph, a multi-label
      model's figures) are removed: those it recorded, and with --overwrite any of `names`.
    """

    command: str  # its name in the record and the messages ("evaluate")
    names: tuple[str, ...]  # every file it may write, relative to its folder
    what: str  # what its files are, for the messages ("an evaluation report")
    own_needs_overwrite: bool = False
    flag: str = "--output_dir"
    overwrite_flag: str = "--overwrite"  # the flag that allows replacing (the fine-tune's: --overwrite_output_dir)

    def check(
        self, folder: str | os.PathLike, overwrite: bool = False, names: Iterable[str] | None = None
    ) -> None:
        """Refuse (FileExistsError) to write into `folder` where the rule forbids it; `names` (default: all
        the command may write) are the files to be written."""
        folder = Path(folder)
        names = sorted(self.names if names is None else names)
        for name in names:
            if (folder / name).is_dir():
                raise IsADirectoryError(
                    f"{folder / name} is a folder, where {self.command} writes a file of {self.what}; move "
                    f"it away, or pass another {self.flag}."
                )
        present = [name for name in names if (folder / name).exists()]
        own = written_by(folder, self.command)
        others = [name for name in present if name not in own]
        if others and not overwrite:
            it = "it" if len(others) == 1 else "them"
            raise FileExistsError(
                f"{folder} holds {_few(others)}, not written there by vit_ft {self.command}; pass "
                f"{self.overwrite_flag} to replace {it} (the folder's other files are kept), or another {self.flag}."
            )
        if self.own_needs_overwrite and present and not overwrite:
            raise FileExistsError(
                f"{folder} holds {self.what} ({_few(present)}); pass {self.overwrite_flag} to replace it (the folder's "
                f"other files are kept), or another {self.flag}."
            )

    @contextmanager
    def staged(self, folder: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
        """Yield a new hidden folder inside `folder` (created if needed) to write the command's files into.
        When the block ends they are checked (`check`), recorded and moved into `folder`, each replacing its
        earlier self, and the command's earlier files not written again are removed; the folder's other files
        are kept. If the block raises, `folder` is left as it was (a folder created here is removed). A full
        disk, in the block or after, is the one full-disk line (`files.disk_full_error`)."""
        folder = Path(folder)
        created, moved, staging = not folder.exists(), False, None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            hidden = tempfile.mkdtemp(prefix=f".{self.command}.", suffix=".part", dir=folder)
            staging = Path(os.path.abspath(hidden))
            yield staging
            written = _files_in(staging)
            self.check(folder, overwrite, written)
            own = written_by(folder, self.command)
            earlier = own | (set(self.names) if overwrite else set())
            # recorded first: a death while moving leaves every moved file known as the command's own
            record_outputs(folder, self.command, own | set(written))
            moved = True
            for name in written:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / name, folder / name)
            for name in sorted(earlier - set(written)):
                if (folder / name).is_file():
                    (folder / name).unlink()
            record_outputs(folder, self.command, written)
        except BaseException as error:
            if is_disk_full(error, folder):
                raise self._disk_full(error, folder, staging, moved) from error
            raise
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if created and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def _disk_full(self, error: BaseException, folder: Path, staging: Path | None, moved: bool) -> OSError:
        """The one full-disk line: the file being written (in `folder`, where known), the space free, what the
        folder holds now and what to do."""
        path, current, seen = folder, error, []
        while current is not None and all(current is not e for e in seen):
            seen.append(current)
            name = getattr(current, "filename", None)
            written = Path(os.path.abspath(name)) if isinstance(name, (str, os.PathLike)) else None
            if staging and written and written.is_relative_to(staging):
                path = folder / written.relative_to(staging)
                break
            current = current.__cause__ or current.__context__
        state = f"the new files are in {folder}, its record of them may be incomplete" if moved else (
            f"nothing in {folder} was changed")  # fmt: skip
        return disk_full_error(path, state, f"Free some space, or pass {self.flag} on another disk")


__all__ = ["OUTPUT_RECORD", "OutputFiles", "check_output_dir", "record_outputs", "written_by"]
