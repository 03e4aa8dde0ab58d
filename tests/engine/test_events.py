"""One event type per protocol message: each one's wire JSON, exactly as README documents it."""

from __future__ import annotations

import dataclasses

import pytest

from oasr.decoding.context import Hotword
from oasr.engine.events import BUSY, Done, Error, Final, Partial, Ready, StreamEvent, Word


@pytest.mark.parametrize(("event", "wire"), [
    (Ready(3, chunk_ms=640),
     {"type": "ready", "stream_id": 3, "sample_rate": 16000, "chunk_ms": 640, "hotwords": []}),
    (Ready(3, chunk_ms=640, hotwords=(Hotword("Oyelaran"), Hotword("Ljubljana", 3.0))),
     {"type": "ready", "stream_id": 3, "sample_rate": 16000, "chunk_ms": 640,
      "hotwords": [{"phrase": "Oyelaran", "boost": 3.0}, {"phrase": "Ljubljana", "boost": 3.0}]}),
    (Partial(3, 1, "hello wor", 2.34567, stable="hello", tentative="", ctc="wor", lag_ms=120),
     {"type": "partial", "segment": 1, "text": "hello wor", "stable": "hello", "tentative": "",
      "ctc": "wor", "end": 2.346, "lag_ms": 120, "words": []}),
    (Partial(3, 1, "hello", 0.5, words=(Word("hello", 0.12, 0.48, 0.91234),)),
     {"type": "partial", "segment": 1, "text": "hello", "stable": "", "tentative": "",
      "ctc": "", "end": 0.5, "lag_ms": 0,
      "words": [{"word": "hello", "start": 0.12, "end": 0.48, "confidence": 0.912}]}),
    (Final(3, 1, "hello world", 0.12345, 2.5, "endpoint", "whisper",
           (("hello", 0.1, 0.5), ("world", 0.6, 2.5)), 3.64),
     {"type": "final", "segment": 1, "text": "hello world", "start": 0.123, "end": 2.5,
      "reason": "endpoint", "source": "whisper", "decided_at": 3.64,
      "words": []}),  # CTC words not sent
    (Done(3, "stop", 2), {"type": "done", "finish_reason": "stop", "segments": 2}),
    (Done(3, "timeout", 0, "no audio for 15 s"),
     {"type": "done", "finish_reason": "timeout", "segments": 0, "message": "no audio for 15 s"}),
    (Error(3, "bad_audio", "NaN"), {"type": "error", "code": "bad_audio", "message": "NaN"}),
], ids=["ready", "ready_hotwords", "partial", "partial_words", "final", "done",
        "done_with_message", "error"])
def test_wire_json(event: StreamEvent, wire: dict) -> None:
    assert event.to_json() == wire
    assert wire["type"] == event.TYPE


@pytest.mark.parametrize(("event", "terminal"), [
    (Ready(1, 640), False),
    (Partial(1, 0, "a", 0.1), False),
    (Final(1, 0, "a", 0.0, 0.1, "endpoint"), False),
    (Error(1, "bad_audio", "x"), False),  # a Done follows
    (Error(1, BUSY, "all slots busy"), True),  # refused: nothing follows
    (Done(1, "stop"), True),
])
def test_the_last_event_of_a_stream_is_terminal(event: StreamEvent, terminal: bool) -> None:
    assert event.is_terminal is terminal


def test_events_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Final(1, 0, "a", 0.0, 0.1, "endpoint").text = "b"  # type: ignore[misc]


def test_a_consumer_matches_on_the_type() -> None:
    def describe(event: StreamEvent) -> str:
        match event:
            case Final(text=text, source=source):
                return f"{source}:{text}"
            case Done(finish_reason=reason):
                return reason
            case _:
                return event.TYPE

    assert [describe(e) for e in (Ready(1, 640), Final(1, 0, "hi", 0.0, 0.4, "stop"),
                                  Done(1, "stop", 1))] == ["ready", "ctc:hi", "stop"]
