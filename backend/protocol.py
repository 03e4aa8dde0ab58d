"""The ``/ws/asr`` protocol (README.md, "The websocket") as a state machine with no I/O.

A connection is in one of three states; each client message either moves it along or is a
``ProtocolError`` that names the error code, the message for the client and the close code:

    AWAITING_START --start / first audio--> STREAMING --end--> ENDED

Everything not on an arrow is refused: a second start, a start after audio, audio after end,
JSON that is not an object or names an unknown type, oversized frames. Sample rates and PCM
formats are checked with ``oasr.audio``'s own rules, the ones the engine applies. A refusal
before ``end`` ends the connection; one after ``end`` does not cost the stream its final (the
connection refuses the message and goes on, `backend.asr_socket`).

A ``start`` with ``"resume": TOKEN`` (and optionally ``"last_final"``) is a `ResumeRequest`: it
takes over a dropped connection's stream, whose protocol state replaces this one's
(`backend.resume`, `backend.asr_socket`).

Hotwords (`oasr.decoding.context`): ``start`` may carry ``"hotwords"`` (phrases or
``{"phrase", "boost"}`` objects), and ``{"type": "hotwords", "hotwords": [...]}`` while
streaming replaces them; their limits are checked here (``bad_hotwords``), their spelling in
the model's units by the engine thread. A bad ``hotwords`` message is refused without ending
the connection: the stream keeps the hotwords it had.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from backend.limits import JsonTooDeep, loads_bounded
from oasr.audio import PCM_FORMATS, validate_sample_rate
from oasr.decoding.context import Hotword, HotwordError, parse_hotwords

DEFAULT_SAMPLE_RATE = 16000
DEFAULT_FORMAT = "s16le"
DEFAULT_MAX_JSON_DEPTH = 8


class CloseCode(enum.IntEnum):
    """Websocket close codes the server uses (RFC 6455 §7.4.1)."""

    NORMAL = 1000
    UNSUPPORTED_DATA = 1003
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


# Close code for each error code the engine or the backend sends.
ERROR_CLOSE_CODES: dict[str, CloseCode] = {
    "bad_request": CloseCode.POLICY_VIOLATION,
    "unsupported": CloseCode.UNSUPPORTED_DATA,
    "bad_audio": CloseCode.UNSUPPORTED_DATA,
    "too_large": CloseCode.MESSAGE_TOO_BIG,
    "too_much_audio": CloseCode.POLICY_VIOLATION,
    "timeout": CloseCode.POLICY_VIOLATION,
    "busy": CloseCode.TRY_AGAIN_LATER,
    "draining": CloseCode.TRY_AGAIN_LATER,
    "bad_hotwords": CloseCode.POLICY_VIOLATION,
    "resume_invalid": CloseCode.POLICY_VIOLATION,
    "resume_expired": CloseCode.POLICY_VIOLATION,
}


def close_code_for(error_code: str) -> CloseCode:
    """The close code that follows an error message with ``error_code`` (1011 if unknown)."""
    return ERROR_CLOSE_CODES.get(error_code, CloseCode.INTERNAL_ERROR)


class ProtocolError(Exception):
    """A client mistake: sent as ``{"type":"error","code":..,"message":..}``, then the close."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def close_code(self) -> CloseCode:
        return close_code_for(self.code)

    def to_json(self) -> dict[str, str]:
        return {"type": "error", "code": self.code, "message": self.message}


class SessionState(enum.Enum):
    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    ENDED = "ended"


@dataclass(frozen=True)
class StartRequest:
    """Open a stream: PCM at ``sample_rate`` Hz, mono, ``fmt`` is s16le or f32le; the
    stream's ``hotwords`` (checked against the limits)."""

    sample_rate: int = DEFAULT_SAMPLE_RATE
    fmt: str = DEFAULT_FORMAT
    hotwords: tuple[Hotword, ...] = ()


@dataclass(frozen=True)
class ResumeRequest:
    """Take over a dropped connection's stream (``backend.resume``): ``token`` is the
    ``resume_token`` of its latest ``ready``; ``last_final`` the segment of the last final the
    client holds (None: every final the server finished sending)."""

    token: str
    last_final: int | None = None


@dataclass(frozen=True)
class EndRequest:
    """The client has sent all its audio."""


@dataclass(frozen=True)
class HotwordsRequest:
    """Replace the stream's hotwords from its next chunk on (``()``: none)."""

    hotwords: tuple[Hotword, ...] = ()


class Session:
    """The protocol state of one ``/ws/asr`` connection.

    Invariant: ``state`` only moves forward (AWAITING_START -> STREAMING -> ENDED); every
    message that would move it elsewhere raises ``ProtocolError`` and leaves it unchanged.
    """

    def __init__(self, max_frame_bytes: int, max_text_bytes: int,
                 max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> None:
        self.state = SessionState.AWAITING_START
        self.max_frame_bytes = max_frame_bytes
        self.max_text_bytes = max_text_bytes
        self.max_json_depth = max_json_depth
        self.num_audio_bytes = 0

    def on_text(self, text: str) -> StartRequest | ResumeRequest | EndRequest | HotwordsRequest:
        """Parse a control message and apply its transition.

        Returns:
            The request the caller must carry out (open the stream / end it).
        Raises:
            ProtocolError: malformed, unknown or out-of-order message.
        """
        size = len(text.encode("utf-8"))
        if size > self.max_text_bytes:
            raise ProtocolError(
                "too_large", f"text message of {size} bytes; the limit is {self.max_text_bytes}")
        message = _parse_object(text, self.max_json_depth)
        kind = message.get("type")
        if kind == "start":
            return self._start(message)
        if kind == "end":
            return self._end()
        if kind == "hotwords":
            return self._hotwords(message)
        raise ProtocolError("bad_request", f"unknown message type {kind!r}; expected 'start', "
                            "'hotwords' or 'end'")

    def on_audio(self, data: bytes) -> StartRequest | None:
        """Check a binary frame; returns an implicit default start if none was sent."""
        if len(data) > self.max_frame_bytes:
            raise ProtocolError(
                "too_large",
                f"audio frame of {len(data)} bytes; the limit is {self.max_frame_bytes}")
        if self.state is SessionState.ENDED:
            raise ProtocolError("bad_request", "audio after end is refused; open a new "
                                "connection for more audio")
        self.num_audio_bytes += len(data)
        if self.state is SessionState.AWAITING_START:
            self.state = SessionState.STREAMING
            return StartRequest()
        return None

    def _start(self, message: dict[str, object]) -> StartRequest | ResumeRequest:
        if self.state is not SessionState.AWAITING_START:
            what = "a second start" if self.num_audio_bytes == 0 else "start after audio"
            raise ProtocolError("bad_request", f"{what}; one start per connection, first")
        if "resume" in message:
            return _resume(message)
        unknown = sorted(set(message) - {"type", "sample_rate", "format", "hotwords"})
        if unknown:
            raise ProtocolError("bad_request", f"unknown start fields {unknown}")
        try:
            rate = validate_sample_rate(message.get("sample_rate", DEFAULT_SAMPLE_RATE))
        except ValueError as exc:
            raise ProtocolError("unsupported", str(exc)) from None
        fmt = message.get("format", DEFAULT_FORMAT)
        if fmt not in PCM_FORMATS:
            raise ProtocolError(
                "unsupported", f"format {fmt!r} is not supported; use one of {list(PCM_FORMATS)}")
        hotwords = _parse_hotwords(message.get("hotwords"))
        self.state = SessionState.STREAMING
        return StartRequest(sample_rate=rate, fmt=fmt, hotwords=hotwords)

    def _end(self) -> EndRequest:
        if self.state is SessionState.ENDED:
            raise ProtocolError("bad_request", "a second end is refused")
        if self.state is SessionState.AWAITING_START:
            raise ProtocolError("bad_request", "end before start or any audio")
        self.state = SessionState.ENDED
        return EndRequest()

    def _hotwords(self, message: dict[str, object]) -> HotwordsRequest:
        if self.state is SessionState.AWAITING_START:
            raise ProtocolError("bad_request", "hotwords before start: give them in the start "
                                "message ('hotwords')")
        if self.state is SessionState.ENDED:
            raise ProtocolError("bad_request", "hotwords after end are refused")
        unknown = sorted(set(message) - {"type", "hotwords"})
        if unknown:
            raise ProtocolError("bad_hotwords", f"unknown hotwords fields {unknown}")
        if "hotwords" not in message:
            raise ProtocolError("bad_hotwords", "a hotwords message needs 'hotwords' (a list; "
                                "[] for none)")
        return HotwordsRequest(_parse_hotwords(message["hotwords"]))


def _parse_hotwords(value: object) -> tuple[Hotword, ...]:
    try:
        return parse_hotwords(value)
    except HotwordError as exc:
        raise ProtocolError("bad_hotwords", str(exc)) from None


def _resume(message: dict[str, object]) -> ResumeRequest:
    """A start that resumes a stream: the stream keeps its own format (and the connection's
    protocol state is the stream's, taken over by the caller)."""
    unknown = sorted(set(message) - {"type", "resume", "last_final"})
    if unknown:
        raise ProtocolError("bad_request", f"unknown fields {unknown} in a resuming start; it "
                            "takes 'resume' and 'last_final' (the stream keeps its format)")
    token, last_final = message["resume"], message.get("last_final")
    if not isinstance(token, str) or not token:
        raise ProtocolError("resume_invalid", "'resume' must be the resume_token of a ready "
                            "message (a string)")
    if last_final is not None and (isinstance(last_final, bool) or not isinstance(
            last_final, int) or last_final < -1):
        raise ProtocolError("bad_request", "'last_final' must be the segment number of the "
                            "last final received (an integer; -1: none yet)")
    return ResumeRequest(token, last_final)


def _parse_object(text: str, max_depth: int) -> dict[str, object]:
    try:
        message = loads_bounded(text, max_depth)
    except JsonTooDeep as exc:
        raise ProtocolError("bad_request", f"text message rejected: {exc}") from None
    except ValueError as exc:
        raise ProtocolError("bad_request", f"text message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(
            "bad_request", f"a JSON object was expected, got {type(message).__name__}")
    return message
