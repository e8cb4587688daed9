"""The load benchmark's ceiling: the served model's own forward throughput, batch 1 against the largest batch."""

import re

import torch

from benchmarks.serve_load import ceiling


def test_ceiling_times_the_served_model_at_both_batches_on_the_servers_thread_count(tiny_finetuned_dir):
    threads = torch.get_num_threads()
    try:
        line = ceiling(str(tiny_finetuned_dir), max_batch=4, threads=1, rounds=1, seconds=0.05)
        assert torch.get_num_threads() == 1  # the server's thread count, which the ceiling is for
    finally:
        torch.set_num_threads(threads)
    found = re.fullmatch(
        r"forward alone, 1 thread\(s\), (\d+)x(\d+) px: batch 1 ([\d.]+) images/s, batch 4 ([\d.]+) images/s: "
        r"batching can gain at most ([\d.]+)x \(median of 1 rounds\)",
        line,
    )
    assert found, line
    one, four, gain = (float(found.group(i)) for i in (3, 4, 5))
    assert one > 0 and four > 0 and abs(gain - four / one) < 0.01 + 0.01 * gain
