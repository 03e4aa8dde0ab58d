"""Helpers to drive an ASREngine synchronously and inspect what it emitted."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

import numpy as np

from oasr.engine import ASREngine, Done, EngineConfig, Final, StreamEvent
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.live.state import LiveStream
from oasr.engine.request import Request

E = TypeVar("E", bound=StreamEvent)


class Collector:
    """Events per stream, as the engine emits them."""

    def __init__(self) -> None:
        self.events: dict[int, list[StreamEvent]] = {}

    def sink(self, stream_id: int):
        self.events[stream_id] = []
        return self.events[stream_id].append

    def of_type(self, stream_id: int, kind: type[E]) -> list[E]:
        return [e for e in self.events[stream_id] if isinstance(e, kind)]

    def done(self, stream_id: int) -> Done:
        done = self.of_type(stream_id, Done)
        assert len(done) == 1, self.events[stream_id]
        return done[0]

    def finals(self, stream_id: int) -> list[str]:
        return [e.text for e in self.of_type(stream_id, Final)]


class FakeClock:
    """Monotonic seconds that move only when a test says (``advance``): timing logic is
    tested without sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def live_stream(stream_id: int = 1, sink=None) -> LiveStream:
    """A stream's live-text state over a bare request (no features, no windower), for the
    policy's unit tests: positions are set on ``stream.view``."""
    request = Request(stream_id, sink or (lambda event: None), 0.0, None, None)  # type: ignore[arg-type]
    return LiveStream(request)


def run_until_idle(engine: ASREngine, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        engine.step()
        if not engine.requests:
            return
    raise AssertionError(f"engine still has {len(engine.requests)} streams after {max_steps} steps")


def run_until_idle_with_finals(engine: ASREngine, max_steps: int = 50_000) -> None:
    """Step until every stream is done, its second-pass finals included (they answer on the
    worker's thread, so an idle step waits for them instead of spinning)."""
    engine.step()
    for _ in range(max_steps):
        if engine.is_idle:
            return
        if not engine.step():
            engine.wait_for_work(0.05)
    raise AssertionError("engine did not become idle")


def stream_all(engine: ASREngine, audio: np.ndarray) -> Collector:
    """Open stream 1, hand it all of ``audio`` and end it; the caller steps the engine."""
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, audio))
    engine.submit(EndStream(1))
    return events


def transcribe_alone(config: EngineConfig, audio: np.ndarray) -> Collector:
    """One stream through its own engine, all audio at once."""
    engine = ASREngine(replace(config, max_batch_size=1))
    events = stream_all(engine, audio)
    run_until_idle(engine)
    return events


def assert_pool_full(engine: ASREngine) -> None:
    res = engine.resources
    assert res.pool.num_free_blocks == res.cache_config.max_num_blocks
    assert res.num_free_slots == res.cache_config.max_batch_size
    assert res.attention.num_streams == 0
