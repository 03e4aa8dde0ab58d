"""Admission by latency: a stream is admitted only while the step can still serve every
admitted stream in real time on this machine.

Slots bound how many streams the pool holds; they say nothing about how many the CPU or GPU
can decode as fast as they speak. `StepCost` says that: the engine seconds one second of a
stream's audio costs (the step's real-time factor, batching included), measured over the
recent busy steps and seeded at start-up (`ASREngine.calibrate`) before any step has run. A
new stream is admitted while ``cost * (running + 1) <= budget``: the share of the engine
thread's time the admitted streams would need stays within the budget, so the streams already
admitted stay real time. What is left over is kept for the host work between steps and the
second pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# audio decoded in the recent window before its measure replaces the start-up seed, seconds
MIN_MEASURED_AUDIO_S = 5.0


class StepCost:
    """Engine seconds per second of one stream's audio, from real steps.

    Args:
        recent: ``(busy seconds, audio seconds)`` of the recent steps (the engine's stats).
        budget: the share of the engine thread's time the admitted streams may need (0, 1].
        seed: the cost before enough audio was decoded to measure it; None: unknown (then
            slots alone bound admission until steps have run).
    """

    def __init__(self, recent: Callable[[], tuple[float, float]], budget: float,
                 seed: float | None = None) -> None:
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"admission budget must be in (0, 1], got {budget}")
        self.recent = recent
        self.budget = budget
        self.seed = seed

    @property
    def per_audio_s(self) -> float | None:
        """Engine seconds per audio second: measured once the recent steps decoded
        `MIN_MEASURED_AUDIO_S` of audio, else the seed (None: not known yet)."""
        busy_s, audio_s = self.recent()
        if audio_s >= MIN_MEASURED_AUDIO_S:
            return busy_s / audio_s
        return self.seed

    def room(self, num_running: int) -> int:
        """How many more streams may be admitted beside ``num_running`` (a large number while
        the cost is not known)."""
        cost = self.per_audio_s
        if cost is None or cost <= 0:
            return 1 << 30
        # one stream always runs: a machine too slow for one in real time still serves one,
        # and its steps measure the cost again (a seed must never shut the server for good)
        return max(0 if num_running else 1, math.floor(self.budget / cost) - num_running)

    def can_admit(self, num_running: int) -> bool:
        return self.room(num_running) > 0
