"""A task's images as the harness trains on them: its Hub dataset read once at a pinned revision, the training
and validation images drawn as the suite draws them, the test split, saved with `save_to_disk` under the
harness's folder (written whole or not at all), which each cell's fine-tune reads as a saved dataset.

The revisions: each task's commit is pinned at its first preparation (the spec's revision, a `--dataset` pin,
or the commit the Hub serves then) and recorded in `datasets.lock.json`; a prepared folder records its own, and
a later run with another pin is refused rather than mixed into the same table.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import datasets

from ..utils.files import staged_folder, write_text_atomically
from ..utils.hub_ids import is_hub_id, split_revision
from .suites import Suite, TaskSpec

LOCK_FILE = "datasets.lock.json"
SOURCE_FILE = "bench_source.json"  # in a prepared task folder: where its images came from
SPLIT_SEED = 0  # FGVC's held-out validation part (VTAB-1k's are the first 800 / next 200: no draw)


def with_pin(spec: TaskSpec, text: str) -> TaskSpec:
    """`spec` with the Hub dataset of a `--dataset NAME=ID[@REV]` value."""
    hub_id, revision = split_revision(text)
    if not is_hub_id(hub_id) or "/" not in hub_id:
        raise ValueError(f"--dataset {spec.name}={text!r}: give the Hub dataset as owner/name or owner/name@revision.")
    return replace(spec, hub_id=hub_id, revision=revision)


def read_lock(folder: Path) -> dict[str, dict[str, str]]:
    path = folder / LOCK_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def pinned(spec: TaskSpec, folder: Path) -> TaskSpec:
    """`spec` at the revision its runs use: the lock file's, else its own, else the commit the Hub serves now
    (recorded in the lock file); a pin that differs from the lock file's is refused."""
    if spec.hub_id is None:
        raise ValueError(f"task {spec.name} has no known Hub copy; give one with --dataset {spec.name}=OWNER/NAME[@REV].")
    lock = read_lock(folder)
    locked = lock.get(spec.name)
    if locked is not None:
        if (spec.revision or locked["revision"]) != locked["revision"] or spec.hub_id != locked["hub_id"]:
            raise ValueError(
                f"task {spec.name} was prepared from {locked['hub_id']}@{locked['revision']} ({folder / LOCK_FILE}); "
                f"{spec.hub_id}@{spec.revision} would mix two datasets in one table: use another --output_dir."
            )
        return replace(spec, revision=locked["revision"])
    if spec.revision is None:
        from huggingface_hub import HfApi

        spec = replace(spec, revision=HfApi().dataset_info(spec.hub_id).sha)
    lock[spec.name] = {"hub_id": spec.hub_id, "revision": spec.revision}
    write_text_atomically(folder / LOCK_FILE, json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return spec


def _splits(spec: TaskSpec, suite: Suite, loaded: datasets.DatasetDict, max_test: int | None) -> dict[str, Any]:
    """The suite's train / validation draw and the test split, columns renamed to image / label."""
    for split in (spec.train_split, spec.test_split):
        if split not in loaded:
            raise KeyError(f"{spec.hub_id}@{spec.revision} has no split {split!r} (task {spec.name}); splits: {sorted(loaded)}.")
    train, test = loaded[spec.train_split], loaded[spec.test_split]
    if suite.train_size is not None:
        needed = suite.train_size + suite.validation_size
        if len(train) < needed:
            raise ValueError(f"task {spec.name}: {spec.hub_id} has {len(train)} training images, fewer than the "
                             f"{needed} {suite.name} draws; lower --train_size / --validation_size.")  # fmt: skip
        validation = train.select(range(suite.train_size, needed))
        train = train.select(range(suite.train_size))
    else:
        parts = train.train_test_split(test_size=suite.validation_fraction, seed=SPLIT_SEED)
        train, validation = parts["train"], parts["test"]
    if max_test is not None and len(test) > max_test:
        test = test.shuffle(seed=SPLIT_SEED).select(range(max_test))
    splits = {"train": train, "validation": validation, "test": test}
    columns = {spec.image_column: "image", spec.label_column: "label"}
    return {name: split.select_columns(list(columns)).rename_columns(columns) for name, split in splits.items()}


def prepare_task(spec: TaskSpec, suite: Suite, folder: Path, max_test: int | None = None) -> Path:
    """The task's saved dataset under `folder/data/<task>` (made once; reused while its source is the same)."""
    spec = pinned(spec, folder)
    target = folder / "data" / spec.name
    source = {"hub_id": spec.hub_id, "revision": spec.revision, "config": spec.config, "train_size": suite.train_size,
              "validation_size": suite.validation_size, "validation_fraction": suite.validation_fraction,
              "max_test": max_test}  # fmt: skip
    if (target / SOURCE_FILE).is_file() and json.loads((target / SOURCE_FILE).read_text()) == source:
        return target
    loaded = datasets.load_dataset(spec.hub_id, spec.config, revision=spec.revision)
    splits = datasets.DatasetDict(_splits(spec, suite, loaded, max_test))
    with staged_folder(target) as partial:
        splits.save_to_disk(str(partial))
        (partial / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return target


__all__ = ["LOCK_FILE", "pinned", "prepare_task", "read_lock", "with_pin"]
