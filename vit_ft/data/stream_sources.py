"""Where a stream reads from (`streaming: true`): one split of a Hub dataset or of a local folder of webdataset
`.tar` shards, opened with `datasets.load_dataset(..., streaming=True)` (only its metadata and file list are read
when opened), its image and label columns standardised (the images left undecoded), the size its metadata states,
and a shard that is not a tar archive as one line naming it, where it is read."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from .dataset_sources import check_columns

__all__ = ["StreamSource", "named_shard_errors", "open_splits", "standard_stream", "stated_size"]


@dataclass(frozen=True)
class StreamSource:
    """One split of a dataset, as `datasets.load_dataset(name, config, split=split, streaming=True)` reads it;
    `name` is a Hub id or a local folder of webdataset `.tar` shards (or of image folders)."""

    name: str
    config: str | None
    split: str
    cache_dir: str | None = None

    def open(self) -> datasets.IterableDataset:
        return open_splits(self.name, self.config, self.cache_dir)[self.split]

    def describe(self) -> str:
        config = f" (config {self.config!r})" if self.config else ""
        return f"split {self.split!r} of dataset {self.name!r}{config}"


def _check_local_shards(folder: Path) -> None:
    """Every `.tar` of a local webdataset folder must be a tar archive: a bad one is one line naming it."""
    for shard in sorted(folder.rglob("*.tar")):
        if not tarfile.is_tarfile(shard):
            raise ValueError(
                f"{shard} is not a tar archive (a webdataset shard must be one); replace or remove it, or "
                "rebuild the shards (e.g. with `tar cf`)."
            )


def open_splits(name: str, config: str | None, cache_dir: str | None) -> datasets.IterableDatasetDict:
    """All splits of a dataset as streams (only its metadata and file list are read here)."""
    local = Path(name).expanduser()
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        raise ValueError(
            f"dataset_name={name!r} is a folder written by save_to_disk, which is read whole; drop streaming "
            "(--streaming false), or stream the Hub dataset or a folder of webdataset .tar shards."
        )
    if local.is_dir():
        _check_local_shards(local)
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=cache_dir, streaming=True)
    except datasets.exceptions.DatasetNotFoundError as error:
        raise FileNotFoundError(
            f"dataset_name={name!r} is neither a local folder nor a dataset on the Hub "
            f"({str(error).rstrip('.')}). Check the id or the path; for a gated dataset, accept its terms on "
            "the Hub and log in first (hf auth login)."
        ) from error
    except tarfile.TarError as error:  # the first shard, read for the features of a Hub webdataset
        raise _not_a_tar(error, f"dataset {name!r}") from None
    if isinstance(loaded, datasets.IterableDataset):
        loaded = datasets.IterableDatasetDict({"train": loaded})
    return loaded


def _shard_of(error: BaseException) -> str | None:
    """The shard being read when `error` was raised: the `tar_path` datasets' webdataset reader was at (its
    error, tarfile's, does not name the file)."""
    traceback = error.__traceback__
    shard = None
    while traceback is not None:
        shard = traceback.tb_frame.f_locals.get("tar_path", shard)
        traceback = traceback.tb_next
    return None if shard is None else str(shard)


def named_shard_errors(rows: Iterator[Any], where: str) -> Iterator[Any]:
    """`rows`, with a shard that is not a tar archive (found only when it is read: a Hub dataset's shards are
    not checked before) as a one-line ValueError naming it; a DataLoader worker re-raises it as a ValueError."""
    try:
        yield from rows
    except tarfile.TarError as error:
        raise _not_a_tar(error, where) from None


def _not_a_tar(error: tarfile.TarError, where: str) -> ValueError:
    shard = _shard_of(error) or f"a shard of {where}"
    return ValueError(
        f"{shard} is not a tar archive ({type(error).__name__}: {error}), read as a webdataset shard of "
        f"{where}; replace or remove that shard (or rebuild the shards, e.g. with `tar cf`)."
    )


def stated_size(stream: datasets.IterableDataset) -> int | None:
    """The number of examples the dataset's metadata states for this split, or None when it states none."""
    splits = stream.info.splits or {}
    split = splits.get(str(stream.split)) if stream.split is not None else None
    count = getattr(split, "num_examples", None)
    return int(count) if count else None




def standard_stream(
    stream: datasets.IterableDataset, image_column: str, label_column: str, where: str
) -> datasets.IterableDataset:
    """The image and label columns alone, named "image" and "label", the images undecoded."""
    features = stream.features
    if features is None:  # a builder that infers them from the first example
        first = next(named_shard_errors(iter(stream), where), None)
        if first is None:
            raise ValueError(f"{where} is empty; choose a split with examples.")
        features = datasets.Features({k: _inferred(v) for k, v in first.items()})
    check_columns(sorted(features), image_column, label_column, where)
    stream = stream.select_columns([image_column, label_column])
    image = None if stream.features is None else stream.features[image_column]
    struct = isinstance(image, dict) and "bytes" in image  # {"bytes", "path"}, as datasets writes images
    if image is not None and not isinstance(image, datasets.Image) and image not in _IMAGE_VALUES and not struct:
        raise ValueError(
            f"image_column={image_column!r} of {where} holds {image}, not images; pass the column with the "
            "images as image_column."
        )
    # undecoded before the renaming, which would otherwise decode every image (and fail on one that is bad)
    stream = stream.cast_column(image_column, datasets.Image(decode=False))
    renames = {old: new for old, new in ((image_column, "image"), (label_column, "label")) if old != new}
    return stream.rename_columns(renames) if renames else stream


_IMAGE_VALUES = (datasets.Value("string"), datasets.Value("binary"))


def _inferred(value: Any) -> Any:
    if isinstance(value, bool):
        return datasets.Value("bool")
    if isinstance(value, int):
        return datasets.Value("int64")
    if isinstance(value, str):
        return datasets.Value("string")
    return datasets.Value("binary")
