"""EngineStats' snapshot: the batch width of each recent step, finals by source, counts only."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
from engine_helpers import Collector, run_until_idle

from oasr.engine import ASREngine, EngineConfig, Final
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.stats import NUM_RECENT_STEPS


def _count_forwards(engine: ASREngine) -> list[int]:
    """Record the number of streams of every batched encoder call the engine makes."""
    widths: list[int] = []
    forward = engine.resources.runner.forward

    def counting_forward(plan):  # type: ignore[no-untyped-def]
        widths.append(len(plan.stream_ids))
        return forward(plan)

    engine.resources.runner.forward = counting_forward  # type: ignore[method-assign]
    return widths


def _numbers_only(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _numbers_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_numbers_only(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def test_recent_batch_sizes_are_the_widths_of_the_last_steps(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    # a bounded history: the long stream below never reaches the per-stream capacity ceiling
    engine = ASREngine(replace(engine_config, num_left_chunks=4))
    widths = _count_forwards(engine)
    events = Collector()
    for sid in (1, 2):  # two streams with their audio at once: stepped together
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[0]))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    assert 2 in widths
    assert list(engine.stats.snapshot.step.recent_batch_sizes) == widths

    engine.submit(OpenStream(3, events.sink(3)))  # then one alone, long enough to roll over
    engine.submit(AppendAudio(3, np.concatenate([speech[2]] * 5)))  # 55 s: ~86 steps
    engine.submit(EndStream(3))
    run_until_idle(engine)
    series = list(engine.stats.snapshot.step.recent_batch_sizes)
    assert len(widths) > NUM_RECENT_STEPS
    assert series == widths[-NUM_RECENT_STEPS:]
    assert set(series) == {1}
    assert engine.stats.snapshot.step.last_batch_size == 1


def test_idle_steps_leave_the_series_alone(engine_config: EngineConfig,
                                          speech: list[np.ndarray]) -> None:
    engine = ASREngine(engine_config)
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[1]))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    before = engine.stats.snapshot.step.recent_batch_sizes
    assert before and set(before) == {1}
    for _ in range(5):
        engine.step()
    engine.stats.refresh(engine.requests, engine.scheduler)
    assert engine.stats.snapshot.step.recent_batch_sizes == before


def test_finals_are_counted_by_source_with_no_text(engine_config: EngineConfig,
                                                   speech: list[np.ndarray]) -> None:
    engine = ASREngine(replace(engine_config, second_pass="none"))
    events = Collector()
    for sid, audio in ((1, speech[0]), (2, speech[3])):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    num_finals = sum(len(events.of_type(sid, Final)) for sid in (1, 2))
    assert num_finals >= 2
    second = engine.stats.snapshot.second_pass
    assert second.finals_by_source == {"whisper": 0, "ctc": num_finals, "combined": 0}
    step = engine.stats.snapshot.step
    assert _numbers_only(step.to_json()) and _numbers_only(second.finals_by_source)
    json.dumps(engine.stats.snapshot.to_json())  # what /api/stats serves


def test_a_new_stream_is_in_the_next_snapshot(engine_config: EngineConfig,
                                              speech: list[np.ndarray]) -> None:
    # a short stream can open, run and end inside one snapshot interval: the snapshot taken
    # when it opened must not still read "idle" (with the old finish count) after its done
    engine = ASREngine(engine_config)
    events = Collector()
    engine.step()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.step()
    streams = engine.stats.snapshot.streams
    assert streams.active + streams.waiting == 1
    engine.submit(AppendAudio(1, speech[1][:16000]))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    assert engine.stats.snapshot.finish_reasons["stop"] == 1
    assert engine.stats.snapshot.streams.active == 0
