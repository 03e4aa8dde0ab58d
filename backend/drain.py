"""Graceful drain: what SIGTERM / SIGINT do to a serving replica.

    SERVING --signal--> DRAINING --no live session, or the deadline--> DRAINED

While DRAINING, ``/readyz`` answers 503 (the load balancer stops sending sessions), new
``/ws/asr`` sessions are refused with ``code: "draining"`` and close 1013 (the client retries
elsewhere), and live sessions run on to their finals. At ``drain_timeout_s`` the streams still
running end with their final and ``finish_reason: "timeout"``; once their connections have
closed (or ``CLOSE_GRACE_S`` later) the server exits with status 0. A second SIGINT skips the
drain (uvicorn's own shutdown: sessions are cut with close 1012); a second SIGTERM is ignored
(Kubernetes sends one after the preStop hook that started the drain).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

CLOSE_GRACE_S = 5.0  # after the deadline: time for the last finals to reach their clients
POLL_S = 0.05


class DrainState(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    DRAINED = "drained"


class Drain:
    """One replica's drain. Event-loop only; ``begin`` is idempotent.

    Invariant: the state only moves forward (SERVING -> DRAINING -> DRAINED).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.state = DrainState.SERVING
        self.started_at: float | None = None  # time.monotonic() of the signal

    @property
    def is_draining(self) -> bool:
        return self.state is not DrainState.SERVING

    def seconds_left(self) -> float | None:
        """Seconds until live streams are ended; None while serving."""
        if self.started_at is None:
            return None
        return max(0.0, self.started_at + self.timeout_s - time.monotonic())

    def begin(self) -> bool:
        """Start draining; False if it had already started."""
        if self.state is not DrainState.SERVING:
            return False
        self.state = DrainState.DRAINING
        self.started_at = time.monotonic()
        logger.info("draining: no new sessions; live ones have %g s to finish", self.timeout_s)
        return True

    async def run(self, num_sessions: Callable[[], int],
                  end_all_streams: Callable[[], None]) -> None:
        """Wait for the live sessions to finish, end the rest at the deadline, return when
        every session has closed (or ``CLOSE_GRACE_S`` after the deadline).

        Args:
            num_sessions: open ``/ws/asr`` connections right now.
            end_all_streams: ends every engine stream with its final and "timeout".
        """
        assert self.started_at is not None, "run() before begin()"
        deadline = self.started_at + self.timeout_s
        while num_sessions() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if num_sessions() > 0:
            logger.warning("drain timeout: ending %d live sessions with 'timeout'",
                           num_sessions())
            end_all_streams()
            grace_end = time.monotonic() + CLOSE_GRACE_S
            while num_sessions() > 0 and time.monotonic() < grace_end:
                await asyncio.sleep(POLL_S)
        self.state = DrainState.DRAINED
        logger.info("drained: %d sessions left open", num_sessions())
