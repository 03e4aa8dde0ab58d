"""What the engine tells a stream's owner: the events of the websocket protocol (DESIGN §5)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class FinishReason(str, enum.Enum):
    """Why a stream ended."""

    STOP = "stop"  # the client said end and everything was decoded
    LENGTH = "length"  # the stream reached the per-stream capacity ceiling
    TIMEOUT = "timeout"  # idle too long, or the maximum session length
    ABORT = "abort"  # the client vanished
    ERROR = "error"  # this stream failed; the others go on


class EventType(str, enum.Enum):
    READY = "ready"
    PARTIAL = "partial"
    FINAL = "final"
    DONE = "done"
    ERROR = "error"


@dataclass(frozen=True)
class StreamEvent:
    """One message for one stream, produced on the engine thread.

    Only the fields of the event's type are meaningful; ``to_json`` emits exactly those.
    """

    type: EventType
    stream_id: int
    segment: int = 0
    text: str = ""
    start: float = 0.0
    end: float = 0.0
    reason: str = ""
    finish_reason: str = ""
    code: str = ""
    message: str = ""
    sample_rate: int = 16000
    chunk_ms: int = 0
    num_segments: int = 0
    source: str = ""  # finals: "ctc" (first pass), "whisper" (second pass) or "combined" (digits)
    # finals: the CTC pass's words with their times, (word, start s, end s); not in to_json
    ctc_words: tuple[tuple[str, float, float], ...] = ()
    stable: str = ""  # partials: the committed words (``oasr.engine.refine``) ...
    tentative: str = ""  # ... the newest refinement's words after them ...
    ctc: str = ""  # ... and the streaming pass's words after the refined audio

    @property
    def is_terminal(self) -> bool:
        """True when the engine has freed the stream after this event."""
        return self.type is EventType.DONE or (self.type is EventType.ERROR and self.code == "busy")

    def to_json(self) -> dict[str, Any]:
        """The protocol message, as DESIGN §5 spells it."""
        kind = self.type.value
        if self.type is EventType.READY:
            return {"type": kind, "stream_id": self.stream_id, "sample_rate": self.sample_rate,
                    "chunk_ms": self.chunk_ms}
        if self.type is EventType.PARTIAL:
            return {"type": kind, "segment": self.segment, "text": self.text,
                    "stable": self.stable, "tentative": self.tentative, "ctc": self.ctc,
                    "end": round(self.end, 3)}
        if self.type is EventType.FINAL:
            return {"type": kind, "segment": self.segment, "text": self.text,
                    "start": round(self.start, 3), "end": round(self.end, 3), "reason": self.reason,
                    "source": self.source}
        if self.type is EventType.DONE:
            done: dict[str, Any] = {"type": kind, "finish_reason": self.finish_reason,
                                    "segments": self.num_segments}
            if self.message:
                done["message"] = self.message  # why, when the server ended the stream
            return done
        return {"type": kind, "code": self.code, "message": self.message}
