"""What the engine tells a stream's owner: the events of the websocket protocol (README.md, "The websocket").

One frozen dataclass per event type; ``StreamEvent`` is their union. A consumer matches on the
class (``isinstance(event, Final)`` or ``match event: case Final(): ...``) and reads fields
that every event of that type has; ``to_json`` gives the protocol message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.decoding.context import Hotword


class FinishReason(str, enum.Enum):
    """Why a stream ended."""

    STOP = "stop"  # the client said end and everything was decoded
    LENGTH = "length"  # the stream reached the per-stream capacity ceiling
    TIMEOUT = "timeout"  # idle too long, or the maximum session length
    ABORT = "abort"  # the client vanished
    ABANDONED = "abandoned"  # suspended (its client's socket dropped) and never resumed
    ERROR = "error"  # this stream failed; the others go on


BUSY = "busy"  # the error code of a stream refused a slot: the engine forgets it at once

WordSpan = tuple[str, float, float]  # (word, start s, end s)


@dataclass(frozen=True)
class Word:
    """A word of a partial or a final: its text, its span in stream seconds (within its
    segment, in order) and how sure the recogniser was of it (0..1: the CTC pass's posterior
    of its letters, or Whisper's probability of its least likely token)."""

    word: str
    start: float
    end: float
    confidence: float

    def to_json(self) -> dict[str, Any]:
        return {"word": self.word, "start": round(self.start, 3), "end": round(self.end, 3),
                "confidence": round(self.confidence, 3)}


@dataclass(frozen=True)
class Ready:
    """The stream has a slot: audio sent from now on is decoded."""

    TYPE: ClassVar[str] = "ready"
    stream_id: int
    chunk_ms: int
    sample_rate: int = MODEL_SAMPLE_RATE
    hotwords: tuple[Hotword, ...] = ()  # the stream's accepted hotwords

    is_terminal: ClassVar[bool] = False

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "stream_id": self.stream_id, "sample_rate": self.sample_rate,
                "chunk_ms": self.chunk_ms, "hotwords": [h.to_json() for h in self.hotwords]}


@dataclass(frozen=True)
class Partial:
    """The open segment's hypothesis changed.

    ``text`` is what to show; with refined partials (``oasr.engine.live.refine``) it is ``stable``
    (committed words) + ``tentative`` (the newest refinement's words after them) + ``ctc`` (the
    streaming pass's words after the refined audio); without, ``stable`` and ``tentative`` are
    "" and ``ctc`` is ``text``. ``words``: the words of ``text`` with their times and
    confidence.
    """

    TYPE: ClassVar[str] = "partial"
    stream_id: int
    segment: int
    text: str
    end: float  # seconds of the stream decoded so far
    stable: str = ""
    tentative: str = ""
    ctc: str = ""
    lag_ms: int = 0  # audio received and not decoded yet when it was sent, in milliseconds
    words: tuple[Word, ...] = ()

    is_terminal: ClassVar[bool] = False

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "segment": self.segment, "text": self.text,
                "stable": self.stable, "tentative": self.tentative, "ctc": self.ctc,
                "end": round(self.end, 3), "lag_ms": self.lag_ms,
                "words": [w.to_json() for w in self.words]}


@dataclass(frozen=True)
class Final:
    """A segment ended (``reason``: "endpoint", a finish reason, "max_length").

    ``source`` says whose text it is: "ctc" (first pass), "whisper" (second pass) or
    "combined" (digits); ``ctc_words`` are the CTC pass's words with their times (not sent).
    ``decided_at``: the stream's audio (seconds) the server had received when it ended the
    segment; ``decided_at - end`` is the pause it waited for, and the final's arrival after
    that audio was sent is the second pass's time. ``words``: the words of ``text`` with
    their times and confidence (sent).
    """

    TYPE: ClassVar[str] = "final"
    stream_id: int
    segment: int
    text: str
    start: float
    end: float
    reason: str
    source: str = "ctc"
    ctc_words: tuple[WordSpan, ...] = ()
    decided_at: float = 0.0
    words: tuple[Word, ...] = ()

    is_terminal: ClassVar[bool] = False

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "segment": self.segment, "text": self.text,
                "start": round(self.start, 3), "end": round(self.end, 3), "reason": self.reason,
                "source": self.source, "decided_at": round(self.decided_at, 3),
                "words": [w.to_json() for w in self.words]}


@dataclass(frozen=True)
class Done:
    """The stream is over and freed; ``message`` says why when the server ended it."""

    TYPE: ClassVar[str] = "done"
    stream_id: int
    finish_reason: str
    num_segments: int = 0
    message: str = ""

    is_terminal: ClassVar[bool] = True

    def to_json(self) -> dict[str, Any]:
        done: dict[str, Any] = {"type": self.TYPE, "finish_reason": self.finish_reason,
                                "segments": self.num_segments}
        if self.message:
            done["message"] = self.message
        return done


@dataclass(frozen=True)
class Error:
    """Something went wrong for this stream. A ``busy`` refusal is the stream's last event;
    any other error is followed by ``Done``."""

    TYPE: ClassVar[str] = "error"
    stream_id: int
    code: str
    message: str
    retry_after_s: float | None = None  # a ``busy`` refusal: when trying again may succeed

    @property
    def is_terminal(self) -> bool:
        """True when the engine has freed the stream after this event (``busy``)."""
        return self.code == BUSY

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.TYPE, "code": self.code, "message": self.message}
        if self.retry_after_s is not None:
            error["retry_after_s"] = self.retry_after_s
        return error


StreamEvent = Ready | Partial | Final | Done | Error
