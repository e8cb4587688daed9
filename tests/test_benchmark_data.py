"""The data section's rows (benchmarks/data.py) on tiny photos: the worker paths interleaved per photo size, the
device augmentation, the bytes per image and the workers an H100 needs. Asserts no speed."""

import re

import pytest

from benchmarks import quick_settings
from benchmarks.data import H100_FEED_RATE, bench_data

pytestmark = pytest.mark.benchmark


def test_data_section_compares_the_worker_paths_and_states_bytes_and_workers():
    settings = quick_settings(sections=("data",), rounds=1, warmup=0, photos_per_round=2)
    rows = bench_data(settings)
    workers = [row for row in rows if row.measurement.startswith("worker path")]
    assert len(workers) == 2 * len(settings.photo_sizes)  # crop + flip and strong, for each photo size
    for (width, height), plain, strong in zip(settings.photo_sizes, workers[::2], workers[1::2], strict=True):
        assert f"{width}x{height} JPEG" in plain.measurement and f"-> {settings.gpu_image_size} px" in plain.measurement
        assert "RandAugment" in strong.measurement and strong.candidate == plain.candidate  # one timing of "new"
        for row in (plain, strong):
            new, old = map(int, re.search(r"(\d+) new.*?(\d+) old", row.note).groups())
            assert new == -(-H100_FEED_RATE // row.candidate_value) and old >= 1
    assert workers[0].target == ">= 2.00"
    (device,) = [row for row in rows if "per-batch augmentation" in row.measurement]
    assert f"batch {settings.gpu_batch_size} of uint8" in device.measurement and device.candidate_value > 0
    (size,) = [row for row in rows if row.unit == "bytes"]
    assert size.ratio == 0.25 and size.met
