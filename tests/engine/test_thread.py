"""EngineThread: streams fed from other threads, events back through sinks, clean shutdown."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
from engine_helpers import transcribe_alone

from oasr.engine import Done, EngineConfig, EngineThread, Final, Ready, StreamEvent


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def _drain(events: queue.Queue[StreamEvent], timeout: float = 60.0) -> list[StreamEvent]:
    out = []
    while True:
        event = events.get(timeout=timeout)
        out.append(event)
        if event.is_terminal:
            return out


@pytest.fixture()
def engine(engine_config: EngineConfig):
    thread = EngineThread(engine_config)
    thread.start()
    yield thread
    thread.stop()
    assert not thread.is_alive()


def test_streams_from_several_threads_match_alone(engine: EngineThread,
                                                  engine_config: EngineConfig,
                                                  speech: list[np.ndarray]) -> None:
    results: dict[int, list[StreamEvent]] = {}

    def client(i: int) -> None:
        events: queue.Queue[StreamEvent] = queue.Queue()
        sid = engine.open_stream(16000, "s16le", events.put)
        pcm = _pcm16(speech[i])
        for start in range(0, len(pcm), 6400):
            engine.feed_audio(sid, pcm[start : start + 6400])
        engine.end_stream(sid)
        results[i] = _drain(events)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(3):
        events = results[i]
        assert isinstance(events[0], Ready)
        assert isinstance(events[-1], Done) and events[-1].finish_reason == "stop"
        quantised = np.clip(speech[i], -1, 1) * 32767
        alone = transcribe_alone(engine_config, (quantised.astype(np.int16) / 32768.0).astype(np.float32))
        finals = [e.text for e in events if isinstance(e, Final)]
        assert finals == alone.finals(1)
    stats = engine.stats()
    assert stats.engine_alive is True
    assert stats.finish_reasons["stop"] == 3
    assert stats.pool.num_used_blocks == 0


def test_feed_after_end_and_unknown_stream(engine: EngineThread) -> None:
    events: queue.Queue[StreamEvent] = queue.Queue()
    sid = engine.open_stream(48000, "f32le", events.put)
    engine.feed_audio(sid, np.zeros(4800, dtype="<f4").tobytes())
    with pytest.raises(ValueError, match="non-finite"):
        engine.feed_audio(sid, np.full(8, np.nan, dtype="<f4").tobytes())
    engine.end_stream(sid)
    with pytest.raises(ValueError, match="audio after end"):
        engine.feed_audio(sid, np.zeros(10, dtype="<f4").tobytes())
    assert _drain(events)[-1].finish_reason == "stop"
    with pytest.raises(KeyError):
        engine.feed_audio(sid, b"\x00\x00")
    engine.end_stream(sid)  # a finished stream: nothing happens
    engine.abort_stream(sid)
    with pytest.raises(KeyError):
        engine.feed_audio(12345, b"\x00\x00")


def test_open_stream_rejects_bad_rate_and_format(engine: EngineThread) -> None:
    with pytest.raises(ValueError):
        engine.open_stream(7, "s16le")
    with pytest.raises(ValueError, match="unsupported format"):
        engine.open_stream(16000, "mp3")


def test_stop_aborts_live_streams(engine_config: EngineConfig) -> None:
    thread = EngineThread(engine_config)
    thread.start()
    events: queue.Queue[StreamEvent] = queue.Queue()
    thread.open_stream(16000, "s16le", events.put)
    thread.stop()
    assert _drain(events, timeout=10)[-1].finish_reason == "abort"
    assert not thread.ready


def test_a_dead_loop_reports_not_ready(engine_config: EngineConfig) -> None:
    thread = EngineThread(engine_config)

    def broken_step() -> bool:
        raise MemoryError("simulated: the loop itself failed")

    thread.engine.step = broken_step  # type: ignore[method-assign]
    thread.start()
    thread._thread.join(10)  # type: ignore[union-attr]
    assert not thread.is_alive() and not thread.ready
    assert isinstance(thread.error, MemoryError)
    assert thread.stats().engine_alive is False
