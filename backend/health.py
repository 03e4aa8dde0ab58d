"""Liveness and readiness, as a load balancer and an orchestrator read them.

- Liveness (``/healthz``): the process answers and its engine loop is alive and coming round.
  503 when the engine thread died (the process then exits non-zero anyway) or is stuck in a
  step: a Kubernetes liveness probe restarts the pod.
- Readiness (``/readyz``): this replica can take one more session now. 503 before the engine
  is up, while draining, when fewer than ``headroom`` stream slots are free, or when the K/V
  pool's free blocks cannot hold ``headroom`` more streams at their ceiling. HAProxy and a
  Kubernetes Service stop sending new sessions while it says 503, and resume when it says 200.
"""

from __future__ import annotations

from dataclasses import dataclass

from oasr.engine import EngineThread
from oasr.engine.runner.capacity import blocks_for_one_stream
from oasr.engine.snapshot import EngineSnapshot


@dataclass(frozen=True)
class Verdict:
    """A probe's answer: ``ok`` (200) or not (503), and why, for humans reading the probe."""

    ok: bool
    reason: str

    @property
    def status_code(self) -> int:
        return 200 if self.ok else 503


def liveness(engine: EngineThread | None, stuck_after_s: float) -> Verdict:
    """Whether the engine loop is alive and not stuck (no engine yet counts as alive: the
    model is loading)."""
    if engine is None:
        return Verdict(True, "starting")
    if engine.error is not None or not engine.is_alive():
        return Verdict(False, f"engine thread died: {engine.error!r}")
    if engine.is_stuck(stuck_after_s):
        return Verdict(False, f"engine loop stuck for more than {stuck_after_s:g} s")
    return Verdict(True, "ok")


def readiness(engine: EngineThread | None, draining: bool,
              snapshot: EngineSnapshot | None, headroom: int) -> Verdict:
    """Whether one more session (``headroom`` more) fits on this replica now."""
    if draining:
        return Verdict(False, "draining")
    if engine is None or not engine.ready or snapshot is None:
        return Verdict(False, "the engine is not running")
    if headroom == 0:
        return Verdict(True, "ready")
    streams = snapshot.streams
    if streams.num_free_slots < headroom:
        return Verdict(False, f"{streams.num_free_slots} free stream slots (need {headroom})")
    if streams.num_admissible < headroom:  # slots free, but the step's cost is the limit
        return Verdict(False, f"{streams.active} streams use the step's real-time capacity "
                       f"(admission by latency; need room for {headroom})")
    pool = snapshot.pool
    if pool.kind == "slots":  # a slot-runtime family: its state does not grow
        return Verdict(True, "ready")
    per_stream = blocks_for_one_stream(engine.engine.resources.cache_config)
    if pool.num_free_blocks < headroom * per_stream:
        return Verdict(False, f"{pool.num_free_blocks} free K/V blocks; {headroom} more "
                       f"streams need {headroom * per_stream}")
    return Verdict(True, "ready")
