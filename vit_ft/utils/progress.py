"""Progress of a pass, in one place: every pass a run makes besides training (the bad-image scan, calibration,
the feature bank, test-time augmentation, the examples, the report's figures, the probes, the audit's folds)
and the tools' batched loops show it through `Progress`.

On a terminal it is one tqdm bar on stderr. Elsewhere (Slurm, nohup, `accelerate launch`'s pipe) a bar writes
cursor escape codes and carriage returns into the log, so it is plain lines instead, a bounded number of them:
one once the pass has run a second (the start: a rate measured over a second, and the time left), then one each
10 % of the pass but no sooner than 10 s after the last (a pass of a few seconds writes no more), at least one a
minute (a slow pass never looks hung), each with the count, the rate and the time left, and one when the pass ends
with the count, the time and the rate (a pass done within its first second, or in one batch, writes that line
alone):

    with Progress(len(images), "Feature bank") as progress:
        for batch in batches:
            ...
            progress.update(len(batch))

    Feature bank: 4800/9600 img (50 %), 31.2 img/s, 2 min 34 s left
    Feature bank: 9600/9600 img in 5 min 08 s (31.2 img/s)

The pass says what it does and how big it is before it starts (its own log line); under several processes
the others say what they wait for (`waiting`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

LINE_EVERY = 0.10  # a plain line each 10 % of the pass: at most 10 for any size, besides the minute's
LINE_GAP = 10.0  # seconds: none sooner after the last (or the start), so a short pass writes its closing line alone
LINE_INTERVAL = 60.0  # seconds: and at least once a minute, so a slow pass never looks hung
FIRST_LINE_AFTER = 1.0  # seconds: the start's line waits for a rate worth reading (not 60000 img/s from 1 image)


def is_terminal(stream: Any = None) -> bool:
    """Whether `stream` (default stderr) is a terminal: tqdm bars there, plain lines elsewhere."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def duration(seconds: float) -> str:
    """A time left or taken in words a log reader scans: "42 s", "3 min 20 s", "1 h 05 min"."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """The progress of one pass over `total` items (None: unknown) named `desc`, counted in `unit`s: a tqdm bar
    on a terminal, plain lines elsewhere (see the module's docstring); `enabled=False` shows nothing, None or
    True shows it. A context manager; `update(n)` after each batch."""

    def __init__(
        self, total: int | None, desc: str, unit: str = "img", enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:  # fmt: skip
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = sys.stderr if stream is None else stream
        self.count, self.start = 0, time.perf_counter()
        self.enabled = enabled is not False
        self.bar = None
        if self.enabled and is_terminal(self.stream):
            from tqdm.auto import tqdm  # only on a terminal: importing tqdm costs the tools' start-up

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)
        self._steps_shown, self._last_line, self._closed, self._postfix = -1, self.start, False, ""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(finished=exc[0] is None)

    def update(self, n: int = 1) -> None:
        """`n` more items done."""
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if not self.enabled or (self.total and self.count >= self.total):
            return  # the closing line says the rest
        now = time.perf_counter()
        # steps of LINE_EVERY passed (the epsilon: 3 x 0.1 is not 0.3 in floats)
        steps = int(self.count / self.total / LINE_EVERY + 1e-9) if self.total else 0
        since = now - self._last_line
        stepped = steps > self._steps_shown and since >= LINE_GAP
        started = self._steps_shown < 0 and now - self.start >= FIRST_LINE_AFTER  # the start's line
        if stepped or since >= LINE_INTERVAL or started:
            self._line(self._status(now))
            self._last_line, self._steps_shown = now, steps

    def postfix(self, **values: Any) -> None:
        """Values shown after the count ("epoch=3/30, train_accuracy=0.912"): on the bar, or on the next line."""
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)
        self._postfix = ", ".join(f"{name} {value}" for name, value in values.items())

    def close(self, finished: bool = True) -> None:
        """End the bar, or write the closing line ("96/96 img in 3.1 s (31.0 img/s)") when the pass finished."""
        if self._closed:
            return
        self._closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and finished:
            seconds = time.perf_counter() - self.start
            counted = f"{self.count}/{self.total}" if self.total is not None else str(self.count)
            self._line(f"{counted} {self.unit} in {duration(seconds)} ({self._rate(seconds)})")

    def _rate(self, seconds: float) -> str:
        if seconds <= 0:
            return f"- {self.unit}/s"
        rate = self.count / seconds  # three figures, never an exponent: "0.412", "31.2", "1780"
        # (.3g rounds 999.5 up to "1e+03": from there whole numbers)
        return f"{rate:.3g} {self.unit}/s" if rate < 999.5 else f"{rate:.0f} {self.unit}/s"

    def _status(self, now: float) -> str:
        seconds = now - self.start
        if not self.total:
            return f"{self.count} {self.unit}, {self._rate(seconds)}"
        left = seconds * (self.total - self.count) / self.count if self.count else float("nan")
        eta = f"{duration(left)} left" if self.count else "time left unknown"
        return f"{self.count}/{self.total} {self.unit} ({100 * self.count / self.total:.0f} %), " \
               f"{self._rate(seconds)}, {eta}"  # fmt: skip

    def _line(self, text: str) -> None:
        postfix = f"; {self._postfix}" if self._postfix else ""
        print(f"{self.desc}: {text}{postfix}", file=self.stream, flush=True)


def waiting(process: int, what: str, stream: TextIO | None = None) -> None:
    """A process other than zero says what it waits for ("Process 1: waiting for process 0 to write the
    feature bank, ..."), so a quiet process in a several-process run is not taken for a hung one."""
    print(f"Process {process}: waiting for process 0 to {what}.", file=stream or sys.stderr, flush=True)


__all__ = ["LINE_EVERY", "LINE_GAP", "LINE_INTERVAL", "Progress", "duration", "is_terminal", "waiting"]
