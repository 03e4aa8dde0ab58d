"""What keeps a live session alive and what admits it: each partial's lag, streams suspended
while their client is away (resumed, or ended "abandoned"), and admission by the step's
measured cost (`oasr.engine.admission`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import FakeClock, assert_pool_full

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.admission import StepCostModel
from oasr.engine.commands import AppendAudio, EndStream, OpenStream, ResumeStream, SuspendStream
from oasr.engine.events import BUSY, Done, Error, Partial, Ready, StreamEvent

RATE = 16_000


def _open(engine: ASREngine, stream_id: int) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    engine.submit(OpenStream(stream_id, events.append))
    return events


def test_a_partial_says_how_far_behind_its_stream_is(engine_config: EngineConfig,
                                                      speech: list[np.ndarray]) -> None:
    engine = ASREngine(engine_config)
    events = _open(engine, 1)
    engine.submit(AppendAudio(1, speech[2][: 6 * RATE]))  # 6 s at once, one chunk a step
    for _ in range(4):
        engine.step()
    lags = [e.lag_ms for e in events if isinstance(e, Partial)]
    assert lags, events
    decoded_ms = [round(e.end * 1000) for e in events if isinstance(e, Partial)]
    for lag, end in zip(lags, decoded_ms, strict=True):
        assert abs(lag - (6000 - end)) <= 30  # what was received less what was decoded
    assert lags == sorted(lags, reverse=True) and lags[0] > 3000
    assert Partial(1, 0, "x", 1.0, lag_ms=250).to_json()["lag_ms"] == 250
    snapshot = engine.latest_stats()
    engine.stats.refresh(engine.requests, engine.scheduler)
    lag = engine.latest_stats().streams.to_json()["lag"]
    assert sum(lag["counts"]) >= len(lags) and lag["sum_s"] > 3 * len(lags)
    assert snapshot is not None


def test_a_suspended_stream_outlives_the_idle_timeout_and_goes_on_when_resumed(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    clock = FakeClock()
    engine = ASREngine(replace(engine_config, idle_timeout_s=5.0, audio_rate_window_s=2.0),
                       clock=clock)
    events = _open(engine, 1)
    engine.submit(AppendAudio(1, speech[0][: RATE]))
    for _ in range(5):
        engine.step()
    engine.submit(SuspendStream(1, window_s=30.0))
    engine.step()
    assert engine.latest_stats().streams.suspended == 1
    clock.advance(20.0)  # four idle timeouts, no audio, no rate
    engine.step()
    assert not any(isinstance(e, Done) for e in events)
    engine.submit(ResumeStream(1))
    engine.submit(AppendAudio(1, speech[0][RATE: 2 * RATE]))
    engine.step()
    clock.advance(1.0)  # resumed: the rules judge it from now, not from before the gap
    engine.submit(EndStream(1))
    for _ in range(20):
        engine.step()
    assert [e.finish_reason for e in events if isinstance(e, Done)] == ["stop"]


def test_a_stream_not_resumed_within_its_window_ends_abandoned(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    clock = FakeClock()
    engine = ASREngine(engine_config, clock=clock)
    events = _open(engine, 1)
    engine.submit(AppendAudio(1, speech[0][: RATE]))
    engine.step()
    engine.submit(SuspendStream(1, window_s=5.0))
    engine.step()
    clock.advance(4.9)
    engine.step()
    assert not any(isinstance(e, Done) for e in events)
    clock.advance(0.2)
    engine.step()
    (done,) = [e for e in events if isinstance(e, Done)]
    assert done.finish_reason == "abandoned" and "resume window" in done.message
    assert engine.latest_stats().finish_reasons["abandoned"] == 1
    assert_pool_full(engine)


def test_streams_beyond_the_cost_budget_wait_then_are_refused_with_a_hint(
        engine_config: EngineConfig) -> None:
    clock = FakeClock()
    config = replace(engine_config, max_batch_size=4, admission_budget=0.5, max_wait_time_s=2.0)
    engine = ASREngine(config, clock=clock)
    assert engine.admission is not None
    # two streams' audio take 0.4 of the engine: a third would not fit
    engine.admission.seed = StepCostModel(fixed_s=0.0, per_audio_s=0.2)
    events = {sid: _open(engine, sid) for sid in (1, 2, 3)}
    engine.step()
    assert [any(isinstance(e, Ready) for e in events[s]) for s in (1, 2, 3)] == [True, True, False]
    assert engine.latest_stats().streams.num_admissible == 0
    clock.advance(2.5)
    engine.step()
    (refused,) = [e for e in events[3] if isinstance(e, Error)]
    assert refused.code == BUSY and refused.retry_after_s == 5.0
    assert "real-time capacity" in refused.message and refused.to_json()["retry_after_s"] == 5.0


def test_calibration_measures_the_step_and_leaves_nothing_behind(
        engine_config: EngineConfig) -> None:
    engine = ASREngine(replace(engine_config, admission_budget=0.8))
    cost = engine.calibrate(num_streams=2, seconds=1.0)
    assert 0 < cost.per_audio_s < math.inf and 0 <= cost.fixed_s < math.inf
    assert engine.admission is not None and engine.admission.seed == cost
    assert engine.admission.model == cost  # nothing measured since: the seed stands
    assert engine.is_idle and engine.stats.finish_reasons["stop"] == 0
    assert_pool_full(engine)
    events = _open(engine, 1)
    engine.step()
    assert any(isinstance(e, Ready) for e in events)
    _open(engine, 2)
    with pytest.raises(RuntimeError, match="calibrate before serving"):
        engine.calibrate()


def test_an_engine_thread_serves_once_calibrated(engine_config: EngineConfig) -> None:
    from oasr.engine import EngineThread

    thread = EngineThread(replace(engine_config, admission_budget=0.8), calibrate=True)
    assert thread.engine.admission is not None and thread.engine.admission.seed is None
    thread.start()
    try:
        deadline = 60
        while not thread.ready and deadline > 0:
            thread._serving.wait(0.1)
            deadline -= 0.1
        assert thread.ready and thread.engine.admission.seed is not None
    finally:
        thread.stop()


def test_the_second_pass_bounds_admission_when_its_budget_is_set(
        engine_config: EngineConfig) -> None:
    from oasr.models import whisper

    if whisper.default_model_dir() is None:
        pytest.skip("no Whisper tiny.en weights")
    clock = FakeClock()
    config = replace(engine_config, second_pass="whisper", admission_budget=0.8,
                     admission_second_pass_budget=0.5)
    engine = ASREngine(config, clock=clock)
    try:
        admission = engine.admission
        assert admission is not None and admission.second_pass is not None
        assert config.refine is not None  # refinements run up to their stream limit
        assert admission.second_pass.min_streams == config.refine.max_streams
        decoders = engine.stats.live.finals.worker
        assert decoders is not None
        # 20 s of steps with 10 streams running and the decoders busy 62.5 % of the time:
        # 1/16 of their time a stream, so 8 streams fit a budget of 0.5
        busy_per_s = 0.625 * decoders.num_decoders
        for second in range(21):
            engine.stats.decoder_history.append((clock() - 20 + second, busy_per_s * second, 10))
        assert admission.second_pass.capacity() == 8
        assert admission.room(6) == 2 and admission.room(10) == 0
    finally:
        engine.shutdown()
    without = ASREngine(replace(config, admission_second_pass_budget=None), clock=clock)
    try:
        assert without.admission is not None and without.admission.second_pass is None
    finally:
        without.shutdown()
