"""Streamed training data (`vit_ft.data.streaming`): local webdataset shards of unequal length read by 2
processes x 2 DataLoader workers (the processes simulated in this one, each with a real 2-worker DataLoader):
every example exactly once a pass, none lost or repeated; a resumed stream reads what an uninterrupted one reads
next; multi-label streams; and bad input as one error line."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.data.datasets import load_image_datasets
from vit_ft.data.streaming import image_key, resume_skip
from vit_ft.utils.cli import error_line

from ..fake_hub import parquet_bytes, tar_shard

SIZES = (7, 3, 5, 1, 4)  # 20 examples in 5 shards of unequal length
NAMES = ["ant", "bee", "wasp"]


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def shards(tmp_path):
    """train-0000{0..4}.tar: example n is a flat image of value n, labelled n % 3."""
    folder, n = tmp_path / "shards", 0
    folder.mkdir()
    for index, size in enumerate(SIZES):
        samples = [(f"{n + i:04d}", {"png": png(n + i), "cls": str((n + i) % 3).encode()}) for i in range(size)]
        (folder / f"train-{index:05d}.tar").write_bytes(tar_shard(samples))
        n += size
    return folder


KEYS = {image_key({"bytes": png(n)}): n for n in range(sum(SIZES))}


def load(folder, **kwargs):
    values = {"image_column": "png", "label_column": "cls", "label_names": NAMES, "validation_split_percentage": 0}
    return load_image_datasets(dataset_name=str(folder), streaming=True, **{**values, **kwargs})


def read(stream, rank, world_size, workers, batches=None, batch_size=1):
    """The examples ids a 2-worker DataLoader of process `rank` yields, batch by batch."""
    stream.rank, stream.world_size, stream.batch_size = rank, world_size, batch_size
    loader = torch.utils.data.DataLoader(stream, batch_size=batch_size, num_workers=workers,
                                         collate_fn=lambda rows: [KEYS[image_key(r["image"])] for r in rows])  # fmt: skip
    out = []
    for batch in loader:
        out.append(batch)
        if batches is not None and len(out) == batches:
            break
    return out


@pytest.mark.parametrize("world_size, workers", [(1, 0), (2, 2), (1, 2)])
def test_each_example_once_a_pass_across_processes_and_workers(shards, world_size, workers):
    splits, names = load(shards)
    stream = splits["train"]
    stream.passes = 1
    seen = [n for rank in range(world_size) for batch in read(stream, rank, world_size, workers) for n in batch]
    assert names == NAMES and sorted(seen) == list(range(sum(SIZES)))


def test_passes_are_reshuffled_and_labels_kept(shards):
    splits, _ = load(shards)
    stream = splits["train"]
    stream.passes = 2
    rows = list(stream)
    first, second = [KEYS[image_key(r["image"])] for r in rows[:20]], [KEYS[image_key(r["image"])] for r in rows[20:]]
    assert sorted(first) == sorted(second) == list(range(20)) and first != second
    assert all(r["label"] == KEYS[image_key(r["image"])] % 3 for r in rows)
    assert len({r["vit_ft_index"] for r in rows}) == 40  # every example of every pass its own augmentation


@pytest.mark.parametrize("trained", [1, 3, 4])
def test_resumed_stream_reads_what_follows(shards, trained):
    splits, _ = load(shards)
    uninterrupted = read(splits["train"], 0, 1, 2, batches=8, batch_size=3)
    splits["train"].resume_from_batch = trained
    assert read(splits["train"], 0, 1, 2, batches=8 - trained, batch_size=3) == uninterrupted[trained:]


def test_resume_skip_counts_each_workers_batches():
    # batches 0..4 from 2 workers: worker 0 made 0, 2, 4; worker 1 made 1, 3
    assert [resume_skip(5, w, 2) for w in (0, 1)] == [3, 2] and resume_skip(0, 1, 2) == 0


def test_multi_label_stream_from_parquet_folder(tmp_path):
    folder = tmp_path / "multi"
    folder.mkdir()
    rows = [{"image": {"bytes": png(n), "path": f"{n}.png"}, "tags": [NAMES[n % 3], NAMES[(n + 1) % 3]]} for n in range(6)]
    (folder / "train-00000.parquet").write_bytes(parquet_bytes(rows))
    splits, names = load_image_datasets(dataset_name=str(folder), streaming=True, label_column="tags",
                                        label_names=NAMES, validation_split_percentage=0)  # fmt: skip
    splits["train"].passes = 1
    labels = [row["label"] for row in splits["train"]]
    assert len(labels) == 6
    assert names == NAMES and all(sum(label) == 2.0 and len(label) == 3 for label in labels)
    assert splits["train"].coding.problem_type == "multi_label_classification"


def not_a_tar(folder):
    (folder / "train-00005.tar").write_bytes(b"this is not a tar archive")
    return {}


BAD = [
    (not_a_tar, "train-00005.tar is not a tar archive"),
    (lambda folder: {"label_column": "label"}, "label_column='label' is not a column"),
    (lambda folder: {"validation_split_percentage": 0.1}, "does not state"),
    (lambda folder: {"label_names": None}, "names no classes"),
    (lambda folder: {"train_split": "training"}, "train_split='training' is not a split"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[m.split()[0] for _, m in BAD])
def test_bad_input_is_one_error_line(shards, change, message):
    with pytest.raises((ValueError, KeyError, OSError)) as caught:
        load(shards, **change(shards))
    line = error_line(caught.value)
    assert message in line and "\n" not in line and line.startswith("error: ")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_that_is_not_a_tar_met_while_reading_is_one_line_naming_it(shards, monkeypatch, workers):
    """A Hub dataset's shards are not checked before training (only a local folder's are): the stream's reading
    names the bad one, and a DataLoader worker's error reaches the user as the same one line."""
    from vit_ft.data import stream_sources

    monkeypatch.setattr(stream_sources, "_check_local_shards", lambda folder: None)
    not_a_tar(shards)
    splits, _ = load(shards)
    splits["train"].passes = 1
    with pytest.raises(ValueError) as caught:
        read(splits["train"], 0, 1, workers)
    line = error_line(caught.value)
    assert "train-00005.tar is not a tar archive" in line and "\n" not in line
    assert "DataLoader worker" not in line and "Traceback" not in line


def test_a_first_shard_that_is_not_a_tar_is_one_line_naming_it(shards, monkeypatch):
    """The first shard of a webdataset is read for its features when the stream is opened."""
    from vit_ft.data import stream_sources

    monkeypatch.setattr(stream_sources, "_check_local_shards", lambda folder: None)
    (shards / "train-00000.tar").write_bytes(b"this is not a tar archive")
    with pytest.raises(ValueError) as caught:
        load(shards)
    assert "train-00000.tar is not a tar archive" in error_line(caught.value)


def test_a_bad_images_row_is_its_own_in_every_pass_and_apart_by_path():
    from vit_ft.data.streaming import bad_image_row

    image = {"bytes": b"", "path": "a.jpg"}
    assert bad_image_row(dict(image)) == bad_image_row(image)
    assert bad_image_row({"bytes": b"", "path": "b.jpg"}) != bad_image_row(image)
    assert bad_image_row({"bytes": b"x", "path": "a.jpg"}) != bad_image_row(image)
