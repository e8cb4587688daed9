"""Atomic writes, in one place: every file or folder vit_ft writes for a user (run records, reports, figures,
predictions, exported models, the digits data) is built under a hidden temporary name beside its target and
renamed into place when complete, so that a death or an error while writing leaves the previous file (or
none), never half of one.

    write_text_atomically(path, text)           # a small text file
    with staged_file(path) as partial: ...      # anything that writes to a path (savefig, copy2, ...)
    with staged_folder(folder) as partial: ...  # a whole folder (an exported model, the examples)
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def move_into_place(temporary: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Rename a finished temporary file (from `tempfile`, mode 0600) to `path`, with the mode `open()` would
    have given it; whatever was at `path` is replaced."""
    os.chmod(temporary, 0o666 & ~_umask())
    os.replace(temporary, path)
    return Path(path)


def usual_modes(folder: str | os.PathLike, pattern: str = "**/*.safetensors") -> None:
    """Give the files `pattern` finds under `folder` that are private (0600) the mode `open()` would (0666 &
    ~umask, 0644 usually): safetensors writes its files 0600 (transformers 5's `save_pretrained` and Trainer's
    checkpoints included), which another user or a container could not read beside 0644 files."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).glob(pattern):
        if path.is_file() and (path.stat().st_mode & 0o777) == 0o600 and mode != 0o600:
            path.chmod(mode)


def _hidden_prefix(name: str) -> str:
    """`.name.`, the temporary name's start; a long name is shortened (`file_stem`), so that the temporary
    name fits the file system's 255 bytes whenever `name` itself does."""
    return f".{name if len(name.encode('utf-8')) <= MAX_STEM_BYTES else file_stem(name)}."


def temporary_sibling(path: str | os.PathLike, suffix: str = ".part") -> Path:
    """A new empty hidden file beside `path` (`.name.XXXX<suffix>`; the parent folder is created), for a
    writer that keeps its file open, to hand to `move_into_place` when done. `suffix` keeps the format
    visible to writers that choose it by extension (matplotlib's savefig)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=_hidden_prefix(path.name), suffix=suffix, dir=path.parent)
    os.close(handle)
    return Path(name)


@contextmanager
def staged_file(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write; it replaces `path` when the block ends, and is removed
    instead if the block raises. `suffix` defaults to `path`'s own (`.part.png` for `figure.png`)."""
    path = Path(path)
    partial = temporary_sibling(path, f".part{path.suffix}" if suffix is None else suffix)
    try:
        yield partial
        move_into_place(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary sibling: a death while writing leaves the previous
    file (or none), never half of one."""
    with staged_file(path) as partial:
        partial.write_text(text, encoding="utf-8")
    return Path(path)


@contextmanager
def staged_folder(folder: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary sibling folder of `folder` to fill; when the block ends it becomes `folder`
    (mode as `mkdir` would give it, its safetensors files as `open` would: `usual_modes`), and is removed
    instead if the block raises.

    replace=True: an existing `folder` is removed first. replace=False: the rename fails with OSError when
    another process created a non-empty `folder` meanwhile (the caller decides whether theirs will do).
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=_hidden_prefix(folder.name), suffix=".part", dir=folder.parent))
    try:
        yield partial
        partial.chmod(0o777 & ~_umask())  # mkdtemp's folders are private (0700)
        usual_modes(partial)  # and safetensors' files (0600)
        if replace and folder.exists():
            shutil.rmtree(folder)
        os.rename(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


MAX_STEM_BYTES = 120  # file systems allow 255 bytes a name; room left for a prefix, a suffix and .part


def file_stem(text: str, max_bytes: int = MAX_STEM_BYTES) -> str:
    """`text` (a class name, a swept value) made a safe file name stem: characters other than letters, digits,
    `.`, `-` and `_` become `_`; a stem over `max_bytes` (UTF-8) keeps a readable prefix and gains a short hash
    of the whole text, so that two long names stay apart ("File name too long" never happens)."""
    stem = re.sub(r"[^\w.-]+", "_", text)
    encoded = stem.encode("utf-8")
    if len(encoded) <= max_bytes:
        return stem
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    prefix = encoded[: max_bytes - len(digest) - 1].decode("utf-8", errors="ignore")
    return f"{prefix}-{digest}"


_DISK_FULL_WORDS = ("no space left on device", "os error 28", "storagefull")
# torch.save's C++ writer loses the errno: "basic_ios::clear: iostream error", "unexpected pos N vs M",
# "PytorchStreamWriter failed writing file"; a full disk is then told by the space left
_WRITE_FAILED_WORDS = ("iostream error", "unexpected pos", "pytorchstreamwriter failed")
_NEARLY_FULL_BYTES = 16 * 2**20


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the errors it was raised from or while handling."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _nearly_full(folder: Path) -> bool:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES


def is_disk_full(error: BaseException, folder: str | os.PathLike = ".") -> bool:
    """Whether `error`, or an error it was raised from, is a full disk (ENOSPC): said by its errno or words,
    or a failed torch write while `folder`'s file system has (almost) no space left."""
    for current in _chain(error):
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        text = str(current).lower()
        if any(words in text for words in _DISK_FULL_WORDS):
            return True
        if any(words in text for words in _WRITE_FAILED_WORDS) and _nearly_full(Path(folder)):
            return True
    return False


def byte_size(n: float, binary: bool = False) -> str:
    """A byte count for people: 512 B, 3.2 kB, 41.0 MB, 1.5 GB; `binary`: 1024-based units (57.0 MiB), as
    memory is counted."""
    step, units = (1024, ("B", "KiB", "MiB", "GiB")) if binary else (1000, ("B", "kB", "MB", "GB"))
    for unit in units:
        if n < step or unit == units[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= step
    raise AssertionError("unreachable")


def disk_full_error(path: str | os.PathLike, state: str, advice: str, needed: int | None = None) -> OSError:
    """The one line (an OSError, errno ENOSPC) for a disk that filled while writing `path`: where, the space
    `needed` where known and the space free there, what `state` the user's files are in, and the `advice`."""
    path = Path(path)
    folder = next((p for p in (path, *path.parents) if p.is_dir()), Path.cwd())
    need = f"at least {byte_size(needed)} needed, " if needed else ""
    full = OSError(
        f"no space left on the disk holding {path} ({need}{byte_size(shutil.disk_usage(folder).free)} free there); "
        f"{state}. {advice}."
    )
    full.errno = errno.ENOSPC  # set after: OSError(errno, text) would print "[Errno 28]" in the line
    return full


__all__ = [
    "byte_size",
    "disk_full_error",
    "is_disk_full",
    "MAX_STEM_BYTES",
    "file_stem",
    "move_into_place",
    "staged_file",
    "staged_folder",
    "temporary_sibling",
    "usual_modes",
    "write_text_atomically",
]
