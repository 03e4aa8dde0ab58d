"""The batching hold in a real engine: under load, a ready chunk waits for a stream whose
next chunk is due within the window, and both run in one step; an idle engine runs at once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import FakeClock

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, OpenStream

SR = 16000


def _engine(config: EngineConfig, busy: float) -> tuple[ASREngine, FakeClock]:
    clock = FakeClock()
    engine = ASREngine(replace(config, batch_window_s=0.1), clock=clock)
    engine.stats.busy_share = lambda now, window_s=2.0: busy  # type: ignore[method-assign]
    for stream_id in (1, 2):
        engine.submit(OpenStream(stream_id, lambda event: None))
    engine.step()  # admitted
    return engine, clock


def _first_window_samples(engine: ASREngine) -> int:
    """Samples after which stream 1's first window is ready (found by feeding 10 ms at a time)."""
    request = engine.requests[1]
    fed = 0
    while not request.windower.is_window_ready(request.features):
        engine.submit(AppendAudio(1, np.zeros(160, dtype=np.float32)))
        now = engine.clock()
        engine._apply_commands(now)
        engine._extract_features(now)
        fed += 160
    return fed


@pytest.mark.parametrize(("busy", "batches"), [(1.0, [2]), (0.0, [1, 1])])
def test_a_ready_chunk_waits_for_one_due_under_load(engine_config: EngineConfig,
                                                    speech: list[np.ndarray], busy: float,
                                                    batches: list[int]) -> None:
    engine, clock = _engine(engine_config, busy)
    need = _first_window_samples(engine)
    audio = speech[0]
    engine.submit(AppendAudio(2, audio[: need - 4 * 160]))  # 40 ms short of its window
    engine.step()
    ran = [engine.stats.last_batch_size] if engine.stats.num_busy_steps else []
    if busy:
        assert ran == [] and engine.hold_s == pytest.approx(0.1)  # stream 1 is held
    clock.advance(0.04)
    engine.submit(AppendAudio(2, audio[need - 4 * 160: need]))  # stream 2's audio comes
    for _ in range(3):
        before = engine.stats.num_busy_steps
        engine.step()
        if engine.stats.num_busy_steps > before:
            ran.append(engine.stats.last_batch_size)
    assert ran == batches


def test_a_hold_ends_at_the_window(engine_config: EngineConfig) -> None:
    engine, clock = _engine(engine_config, 1.0)
    need = _first_window_samples(engine)
    engine.submit(AppendAudio(2, np.zeros(need - 4 * 160, dtype=np.float32)))
    engine.step()
    assert engine.stats.num_busy_steps == 0 and engine.hold_s == pytest.approx(0.1)
    clock.advance(0.1)  # stream 2's audio is late: stream 1 runs alone
    engine.step()
    assert engine.stats.num_busy_steps == 1 and engine.stats.last_batch_size == 1
    assert engine.hold_s is None
