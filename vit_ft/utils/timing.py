"""Interleaved timing, the one way vit_ft times things against each other: the benchmarks' contenders
(`benchmarks.common`) and the deployment report's runtimes (`tools.export.runtimes`). Every contender is called
once per round, in an order rotated by one each round, so that a machine that slows down mid-run slows every
contender alike."""

from __future__ import annotations

import time
from collections.abc import Callable


def interleave(
    contenders: dict[str, Callable[[], float | None]], warmup: int, rounds: int
) -> dict[str, list[float]]:
    """Seconds per call of each contender: `warmup` untimed calls each, then `rounds` rounds that call every
    contender once, in an order rotated by one each round. A contender that returns a float reports its own
    time (the ceiling, which adds up per-shape times); otherwise the call is timed from outside."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            reported = contenders[name]()
            times[name].append(reported if isinstance(reported, float) else time.perf_counter() - start)
    return times


__all__ = ["interleave"]
