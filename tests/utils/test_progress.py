"""`utils.progress`: plain lines where stderr is not a terminal (a bounded number: the start's after a second, each 10 %
but not sooner than 10 s apart, once a minute, the closing line; count, rate, time left, no escape codes or carriage
returns), a tqdm bar on a terminal, nothing when off; a waiting process says why."""

from __future__ import annotations

import io

import pytest

from vit_ft.utils import progress as progress_module
from vit_ft.utils.progress import LINE_EVERY, LINE_INTERVAL, Progress, duration, waiting


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _timed_pass(monkeypatch, total: int, seconds_each: float, batch: int = 1, desc: str = "Feature bank") -> list:
    """The lines a pass over `total` images in batches of `batch`, each batch `seconds_each`, writes to a log."""
    stream, clock = io.StringIO(), [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    with Progress(total, desc, stream=stream) as progress:
        for start in range(0, total, batch):
            clock[0] += seconds_each
            progress.update(min(batch, total - start))
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text
    return text.splitlines()


def test_a_short_pass_writes_its_start_and_its_end_with_name_count_and_rate(monkeypatch):
    # 20 images one at a time in 5 s: the start's line once a second has passed, none after it worth its own
    lines = _timed_pass(monkeypatch, 20, 0.25)
    assert lines == ["Feature bank: 4/20 img (20 %), 4 img/s, 4.0 s left",
                     "Feature bank: 20/20 img in 5.0 s (4 img/s)"]  # fmt: skip


def test_a_pass_done_within_a_second_writes_its_closing_line_alone(monkeypatch):
    # the examples of a small run: 10 images in 10 ms; a rate from its first image alone would read 1000s img/s
    assert _timed_pass(monkeypatch, 10, 0.001, desc="Examples") == ["Examples: 10/10 img in 0.0 s (1000 img/s)"]


def test_a_pass_of_a_minute_writes_a_line_each_10_percent_but_not_sooner_than_the_gap(monkeypatch):
    # 20 images at 3 s each: the first's line, then 10 % is 6 s, below the gap: a line each 4 images (12 s)
    lines = _timed_pass(monkeypatch, 20, 3.0)
    assert lines[0] == "Feature bank: 1/20 img (5 %), 0.333 img/s, 57 s left"
    assert [line.split(" img")[0] for line in lines] == ["Feature bank: " + f"{n}/20" for n in (1, 5, 9, 13, 17, 20)]
    assert lines[-1] == "Feature bank: 20/20 img in 1 min 00 s (0.333 img/s)"


def test_a_pass_in_one_slow_batch_writes_its_closing_line_alone(monkeypatch):
    # the dogs first try's validation: 32 images in one batch of 65 s, past the minute but already done
    assert _timed_pass(monkeypatch, 32, 65.0, batch=128) == ["Feature bank: 32/32 img in 1 min 05 s (0.492 img/s)"]


@pytest.mark.parametrize("total, seconds_each, batch", [(1000, 1.0, 10), (100_000, 0.01, 1), (50, 30.0, 1)])
def test_any_pass_writes_at_most_one_line_each_10_percent_and_one_a_minute(monkeypatch, total, seconds_each, batch):
    lines = _timed_pass(monkeypatch, total, seconds_each, batch)
    minutes = total / batch * seconds_each / LINE_INTERVAL
    assert len(lines) <= 1 + round(1 / LINE_EVERY) + int(minutes) + 1  # the start, 10 % steps, minutes, the end
    assert lines[-1].startswith(f"Feature bank: {total}/{total} img in ") and "img/s)" in lines[-1]
    assert all("img/s, " in line and " left" in line for line in lines[:-1])


def test_a_slow_pass_writes_a_line_at_least_once_a_minute(monkeypatch):
    stream, clock = io.StringIO(), [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    progress = Progress(10_000, "Audit", stream=stream)
    clock[0] = 61.0
    progress.update(1)  # 0.01 %: below the next step, but a minute has passed
    assert stream.getvalue() == "Audit: 1/10000 img (0 %), 0.0164 img/s, 169 h 25 min left\n"


def test_an_unknown_total_and_a_postfix_read_in_the_lines(monkeypatch):
    stream, clock = io.StringIO(), [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    with Progress(None, "Pre-training", unit="step", stream=stream) as progress:
        clock[0] = 70.0
        progress.postfix(epoch="3/30")
        progress.update(7)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "Pre-training: 7 step, 0.1 step/s; epoch 3/30",
        "Pre-training: 7 step in 1 min 10 s (0.1 step/s); epoch 3/30",
    ]


def test_a_terminal_gets_a_bar_and_off_means_nothing():
    terminal = Terminal()
    with Progress(4, "Examples", stream=terminal) as progress:
        assert progress.bar is not None
        progress.update(4)
    assert "Examples" in terminal.getvalue() and "\r" in terminal.getvalue()  # tqdm's own redraws
    quiet = io.StringIO()
    with Progress(4, "Examples", enabled=False, stream=quiet) as progress:
        progress.update(4)
    assert quiet.getvalue() == ""


def test_a_pass_that_fails_writes_no_closing_line():
    stream = io.StringIO()
    with pytest.raises(RuntimeError), Progress(10, "Calibration", stream=stream) as progress:
        progress.update(1)
        raise RuntimeError("boom")
    assert "in " not in stream.getvalue()


@pytest.mark.parametrize(
    "seconds, words", [(4.25, "4.2 s"), (42, "42 s"), (200, "3 min 20 s"), (3900, "1 h 05 min")]
)
def test_durations_read_in_words(seconds, words):
    assert duration(seconds) == words


def test_a_waiting_process_says_for_what():
    stream = io.StringIO()
    waiting(1, "write the output folder", stream)
    assert stream.getvalue() == "Process 1: waiting for process 0 to write the output folder.\n"


def test_a_fast_pass_states_its_rate_without_an_exponent(monkeypatch):
    stream, clock = io.StringIO(), [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    with Progress(1293, "Feature bank", stream=stream) as progress:
        clock[0] = 0.5
        progress.update(1293)
    assert stream.getvalue().splitlines()[-1] == "Feature bank: 1293/1293 img in 0.5 s (2586 img/s)"
