"""Timeouts judge the client, not the engine: a stream whose audio the engine is still working
through (its socket paused by backpressure) is neither idle nor starved; a stream that sends
too little audio is."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from engine_helpers import FakeClock

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.events import Done, StreamEvent


def test_a_backlog_the_engine_works_through_slowly_is_not_idle(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    # 3 s of audio at once, then nothing: the engine takes one 640 ms chunk a step, and here
    # a step every 0.3 s, so the backlog lasts longer than the 0.5 s idle timeout
    clock = FakeClock()
    engine = ASREngine(replace(engine_config, idle_timeout_s=0.5, audio_rate_window_s=1.0),
                       clock=clock)
    events: list[StreamEvent] = []
    engine.submit(OpenStream(1, events.append))
    engine.submit(AppendAudio(1, speech[0][: 3 * 16000]))
    for _ in range(5):
        engine.step()
        clock.advance(0.3)
    engine.submit(EndStream(1))
    for _ in range(10):
        engine.step()
    done = [e for e in events if isinstance(e, Done)]
    assert [d.finish_reason for d in done] == ["stop"], events[-3:]


def test_a_stream_feeding_under_the_minimum_rate_times_out_with_a_reason(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    clock = FakeClock()
    engine = ASREngine(replace(engine_config, idle_timeout_s=30.0, audio_rate_window_s=1.0),
                       clock=clock)
    events: list[StreamEvent] = []
    engine.submit(OpenStream(1, events.append))
    for _ in range(50):  # 10 s
        engine.submit(AppendAudio(1, speech[0][:160]))  # 10 ms of audio every 200 ms: 5% of
        engine.step()  # real time, and never silent long enough for the idle timeout
        clock.advance(0.2)
        if any(isinstance(e, Done) for e in events):
            break
    done = next(e for e in events if isinstance(e, Done))
    assert done.finish_reason == "timeout"
    assert "under 10% of real time" in done.message
    assert done.to_json()["message"] == done.message
