"""Whether a name is a Hugging Face Hub repository id, in one place: huggingface_hub's own
`validate_repo_id` ("name" or "namespace/name", letters, digits, '-', '_', '.', at most 96 characters, no
'--' or '..', not ending in '-', '.' or '.git'), restricted to ASCII (its `\\w` also admits other letters,
which the Hub does not). Tools ask it whether a --model can only be a local path; push checks
--hub_model_id with it; the model card links a base model only when it is one."""

from __future__ import annotations

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
    """True when `model` cannot be a Hub id: absolute, `.`/`~`-relative, or not of the `namespace/name` shape."""
    text = os.fspath(model)
    return os.path.isabs(text) or text.startswith((".", "~")) or not is_hub_id(text)


def check_hub_id(repo_id: str, flag: str = "--hub_model_id") -> None:
    """Raise ValueError naming `flag` unless `repo_id` is a Hub repository id."""
    if not is_hub_id(repo_id):
        raise ValueError(
            f"{flag} {repo_id!r} is not a repo id; a repo id is 'namespace/name' or 'name' (letters, digits, "
            "'-', '_', '.'; no '--' or '..'), e.g. me/vit-dogs."
        )


__all__ = ["check_hub_id", "is_hub_id", "is_hub_model", "looks_like_path"]
