"""Whether a name is a Hugging Face Hub repository id, in one place: huggingface_hub's own
`validate_repo_id` ("name" or "namespace/name", letters, digits, '-', '_', '.', at most 96 characters, no
'--' or '..', not ending in '-', '.' or '.git'), restricted to ASCII (its `\\w` also admits other letters,
which the Hub does not). Tools ask it whether a --model can only be a local path; push checks
--hub_model_id with it; the model card links a base model only when it is one.

`check_model_reference` is the one check of a model named on a command line (the tools' --model, the
fine-tune's model_name_or_path, through `model.checks` and `commands.model_flags`): whether a name is a path
(`looks_like_path`), which folder was meant (`closest_path`), and whether the Hub answers at all, asked once and
without huggingface_hub's retries (`check_hub_reachable`), so that no network fails in a second."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any


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


def check_hub_reachable(repo_id: str, what: str | None = None, cache_dir: str | os.PathLike | None = None) -> None:
    """Fail at once, with one line, where `repo_id` is not in the local Hub cache and the Hub cannot be reached:
    huggingface_hub retries a lookup that finds no cached file five times with backoff (about 25 s per file,
    80 s for a model's files), so one HEAD request without retries asks first. Nothing is asked in offline
    mode (HF_HUB_OFFLINE=1 fails at once by itself) or for a model in the cache (`cache_dir`, else the
    default). `what` names the model in the message (e.g. "--model me/vit")."""
    from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.file_download import get_hf_file_metadata

    try:
        from httpx2 import TransportError
    except ImportError:  # pragma: no cover - older huggingface_hub releases use httpx
        from httpx import TransportError

    if constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(repo_id, "config.json", cache_dir), str):
        return
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except TransportError as error:
        raise ConnectionError(
            f"{what or repo_id}: no such folder here, and the Hub ({constants.ENDPOINT}) cannot be reached to look "
            f"it up ({' '.join(str(error).split()) or type(error).__name__}). This needs the network: connect, or "
            "pass a local model folder."
        ) from None
    except Exception:  # not found, gated, ...: transformers' own loading says which, without retrying
        return


def check_model_reference(
    name: str | os.PathLike,
    what: str,
    expected: str,
    error: type[Exception] = FileNotFoundError,
    cache_dir: str | os.PathLike | None = None,
) -> None:
    """The check of a model named by the user, before anything is loaded: `error` ("<what>: no such folder; did
    you mean <the closest folder>?", else "...; pass <expected>.") when `name` is a local path (see
    `looks_like_path`) that does not exist; a Hub id that is no folder here is looked up once, without retries
    (`check_hub_reachable`)."""
    if Path(name).expanduser().exists():
        return
    if looks_like_path(name):
        close = closest_path(name)
        raise error(f"{what}: no such folder; " + (f"did you mean {close}?" if close else f"pass {expected}."))
    check_hub_reachable(os.fspath(name), what, cache_dir)


def check_hub_id(repo_id: str, flag: str = "--hub_model_id") -> None:
    """Raise ValueError naming `flag` unless `repo_id` is a Hub repository id."""
    if not is_hub_id(repo_id):
        raise ValueError(
            f"{flag} {repo_id!r} is not a repo id; a repo id is 'namespace/name' or 'name' (letters, digits, "
            "'-', '_', '.'; no '--' or '..'), e.g. me/vit-dogs."
        )


__all__ = [
    "check_hub_id",
    "check_hub_reachable",
    "check_model_reference",
    "closest_path",
    "is_hub_id",
    "is_hub_model",
    "looks_like_path",
]
