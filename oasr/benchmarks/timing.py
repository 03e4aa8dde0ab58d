"""Timing the bench scripts share: calls alternated round by round, so that a burst of load
from a neighbour slows each of them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternated_median_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each call's median milliseconds over ``repeats`` rounds, the calls alternated within
    each round (one untimed call of each first)."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}
