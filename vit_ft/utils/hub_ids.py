"""Whether a name is a Hugging Face Hub repository id, in one place: huggingface_hub's own
`validate_repo_id` ("name" or "namespace/name", letters, digits, '-', '_', '.', at most 96 characters, no
'--' or '..', not ending in '-', '.' or '.git'), restricted to ASCII (its `\\w` also admits other letters,
which the Hub does not). Tools ask it whether a --model can only be a local path; push checks
--hub_model_id with it; the model card links a base model only when it is one.

`check_reference` is the one check of a model or dataset named by the user (the tools' --model and --dataset,
the fine-tune's model_name_or_path and dataset_name, the demo's model; through `commands.model_flags`): whether a
name is a path (`looks_like_path`), which folder was meant (`closest_path`), whether offline mode has it in the
Hub cache (`in_hub_cache`), and whether the Hub answers at all, asked once and without huggingface_hub's retries
(`check_hub_reachable`), so that a typo fails in a second, online or offline. Within `without_network()` (the
fine-tune's `--print_plan`) it asks nothing: the local checks stand, and a Hub id the cache does not hold is left
unchecked and named in the list it yields."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

# within `without_network()`: what `check_reference` could not check without the network (None: it may ask)
_UNCHECKED: ContextVar[list[str] | None] = ContextVar("vit_ft_unchecked_references", default=None)


def is_hub_id(name: Any) -> bool:
    """Whether `name` (a str) has the form of a Hub repository id; says nothing about whether it exists."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(name, str) or not name or not name.isascii():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def split_revision(name: str) -> tuple[str, str | None]:
    """`namespace/name@revision` -> ("namespace/name", "revision"): a Hub id with a branch, tag or commit id after
    '@' (`datasets.load_dataset`'s `revision`); anything else -> (name, None), a local path that exists included."""
    repo_id, at, revision = name.rpartition("@")
    if not at or not revision or not is_hub_id(repo_id) or Path(name).expanduser().exists():
        return name, None
    return repo_id, revision


def is_hub_model(name: Any) -> bool:
    """A Hub id that does not name a local path either (`outputs/digits` has the form of one)."""
    return is_hub_id(name) and not Path(name).expanduser().exists()


def looks_like_path(model: str | os.PathLike) -> bool:
    """True when `model` names a local path, not a Hub id: absolute, `~`-relative, `./` or `../` (or `.`),
    more than one slash, not of the `namespace/name` shape at all, or a `namespace/name` whose namespace is an
    existing local folder (`outputs/digitz` when `outputs/` is here)."""
    text = os.fspath(model)
    if os.path.isabs(text) or text.startswith((".", "~")) or text.count("/") > 1 or not is_hub_id(text):
        return True
    namespace, slash, _ = text.partition("/")
    return bool(slash) and Path(namespace).is_dir()


def closest_path(path: str | os.PathLike) -> str | None:
    """The existing name beside a missing `path` closest to it (difflib), as the user would type it, or None:
    `outputs/digitz` -> `outputs/digits`."""
    text = os.fspath(path)
    parent = Path(text).expanduser().parent
    if not parent.is_dir():
        return None
    names = [entry.name for entry in parent.iterdir() if not entry.name.startswith(".")]
    close = difflib.get_close_matches(Path(text).name, names, n=1, cutoff=0.6)
    return os.path.join(os.path.dirname(text), close[0]) if close else None


def in_hub_cache(repo_id: str, repo_type: str = "model", cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether the Hub cache holds anything of `repo_id` (`cache_dir`, else the default): a snapshot in the Hub
    cache, or for a dataset also the datasets cache's prepared copy (`namespace___name`), which is all that
    offline mode can load."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    roots = [Path(cache_dir)] if cache_dir else [Path(constants.HF_HUB_CACHE)]
    names = [f"{repo_folder_name(repo_id=repo_id, repo_type=repo_type)}/snapshots"]
    if repo_type == "dataset":
        roots.append(Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets"))
        names.append(repo_id.replace("/", "___"))
    return any((root / name).is_dir() and any((root / name).iterdir()) for root in roots for name in names)


def _is_builder(name: str, repo_type: str) -> bool:
    """A dataset name that `datasets` builds locally (imagefolder, parquet, webdataset, ...), not a Hub repo."""
    if repo_type != "dataset" or "/" in name:
        return False
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # pragma: no cover - a datasets release that moved it: ask the Hub as for any name
        return False
    return name in _PACKAGED_DATASETS_MODULES


def check_hub_reachable(
    repo_id: str,
    what: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    repo_type: str = "model",
) -> None:
    """Fail at once, with one line, where `repo_id` is not in the local Hub cache and the Hub cannot be reached:
    huggingface_hub retries a lookup that finds no cached file five times with backoff (about 25 s per file,
    80 s for a model's files), so one HEAD request without retries asks first. Nothing is asked in offline
    mode or for a repository in the cache (`in_hub_cache`). `what` names it in the message (e.g. "--model me/vit").
    A repository the Hub does not know (or a private one without a login) is a FileNotFoundError naming it."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    from huggingface_hub.file_download import get_hf_file_metadata

    try:
        from httpx2 import TransportError
    except ImportError:  # pragma: no cover - older huggingface_hub releases use httpx
        from httpx import TransportError

    if constants.HF_HUB_OFFLINE or in_hub_cache(repo_id, repo_type, cache_dir):
        return
    # a missing file is an answer too: the repo is there
    probe = "config.json" if repo_type == "model" else "README.md"
    try:
        get_hf_file_metadata(
            hf_hub_url(repo_id, probe, repo_type=repo_type), timeout=constants.HF_HUB_ETAG_TIMEOUT
        )
    except TransportError as error:
        raise ConnectionError(
            f"{what or repo_id}: no such folder here, and the Hub ({constants.ENDPOINT}) cannot be reached to look "
            f"it up ({' '.join(str(error).split()) or type(error).__name__}). This needs the network: connect, or "
            f"pass a local {'model' if repo_type == 'model' else 'data'} folder."
        ) from None
    except GatedRepoError:  # it exists: transformers / datasets say how to get access
        return
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{what or repo_id}: no such folder here, and no {repo_type} of that name on the Hub "
            f"({constants.ENDPOINT}); check the path or the id (for a private one, log in first: hf auth login)."
        ) from None
    except Exception:  # a file missing in a repo that exists, ...: the loader's own message says what
        return


@contextmanager
def without_network() -> Iterator[list[str]]:
    """Within it, `check_reference` makes no network request: a missing local path still fails (one line), and
    a Hub id that the Hub cache does not hold is not checked but named, with why, in the list this yields (what
    `--print_plan` states beside the plan; the run itself checks it before loading anything)."""
    token = _UNCHECKED.set([])
    try:
        yield _UNCHECKED.get()
    finally:
        _UNCHECKED.reset(token)


def _unchecked(what: str) -> str:
    """Why a Hub id was left unchecked without the network, and what the run will do with it."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return (
            f"{what}: a Hub id, not in the Hub cache, so offline mode (HF_HUB_OFFLINE=1) cannot load it: the run "
            "will refuse it unless it is downloaded first"
        )
    return f"{what}: a Hub id, not in the Hub cache; not looked up (no network request), the run looks it up first"


def check_reference(
    name: str | os.PathLike,
    what: str,
    expected: str,
    repo_type: str = "model",
    cache_dir: str | os.PathLike | None = None,
    folder: bool = False,
) -> None:
    """The one check of a model or dataset named by the user, before anything is loaded (the fine-tune's
    model_name_or_path and dataset_name, every tool's --model and --dataset, the demo's model), whatever
    HF_HUB_OFFLINE says. FileNotFoundError, one line: "<what>: no such folder; did you mean <the closest
    folder>?" (else "...; pass <expected>.") when `name` is a local path (`looks_like_path`) that does not
    exist, or in offline mode a Hub id with nothing in the Hub cache (`in_hub_cache`), which offline mode
    cannot load. Online, a Hub id that is no folder here is looked up once, without retries
    (`check_hub_reachable`). `repo_type` is "model" or "dataset"; a dataset builder name (imagefolder, ...) passes.
    `folder`: a file is a NotADirectoryError (the tools read model folders; the fine-tune also reads a JAX .npz).
    Within `without_network()` a Hub id not in the cache is only named in its list."""
    from huggingface_hub import constants

    text = os.fspath(name)
    if folder and Path(text).expanduser().is_file():
        raise NotADirectoryError(f"{what} is a file; pass the folder that holds config.json ({expected}).")
    if Path(text).expanduser().exists() or _is_builder(text, repo_type):
        return
    if looks_like_path(text):
        close = closest_path(text)
        raise FileNotFoundError(
            f"{what}: no such folder; " + (f"did you mean {close}?" if close else f"pass {expected}.")
        )
    unchecked = _UNCHECKED.get()
    if unchecked is not None:  # no network: the cache answers, or nothing does
        if not in_hub_cache(text, repo_type, cache_dir):
            unchecked.append(_unchecked(what))
        return
    if constants.HF_HUB_OFFLINE and not in_hub_cache(text, repo_type, cache_dir):
        raise FileNotFoundError(
            f"{what}: no such folder, and offline mode (HF_HUB_OFFLINE=1) finds no {repo_type} of that name in the "
            f"Hub cache; pass {expected} that is on this machine, or download it first with the network on."
        )
    check_hub_reachable(text, what, cache_dir, repo_type)


TRAINED_MODEL = "a model folder, a LoRA adapter folder or a Hub id"  # what the tools' --model takes


def check_hub_id(repo_id: str, flag: str = "--hub_model_id") -> None:
    """Raise ValueError naming `flag` unless `repo_id` is a Hub repository id."""
    if not is_hub_id(repo_id):
        raise ValueError(
            f"{flag} {repo_id!r} is not a repo id; a repo id is 'namespace/name' or 'name' (letters, digits, "
            "'-', '_', '.'; no '--' or '..'), e.g. me/vit-dogs."
        )


__all__ = [
    "TRAINED_MODEL",
    "check_hub_id",
    "check_hub_reachable",
    "check_reference",
    "closest_path",
    "in_hub_cache",
    "is_hub_id",
    "is_hub_model",
    "looks_like_path",
    "split_revision",
    "without_network",
]
