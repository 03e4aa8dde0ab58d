"""OpenAI's realtime transcription socket: ``/v1/realtime?intent=transcription``.

Each turn of audio is one engine stream (its own slot, batched with every other stream):

- ``server_vad``: one stream takes the appended audio and the engine's endpointer ends its
  segments (``silence_duration_ms`` is the stream's silence-after-speech rule); each segment
  is an item: ``speech_started`` when its first words appear, then at its final
  ``speech_stopped``, ``committed`` and ``...transcription.completed``.
- manual (``turn_detection: null``): the appended audio goes to a stream until the client's
  ``input_audio_buffer.commit`` ends it; its finals, joined, are the item's transcript. A
  buffer the engine ends first (no audio for ``--idle-timeout``) is committed as it stands.

Partials become ``...transcription.delta`` events of whole words (a partial's last word may
still change, so it waits for the next space): a delta only ever appends. When a refined
partial rewrites words already sent, no delta is sent until the hypothesis again extends
what was sent; ``completed`` carries the final text (the second pass's when it ran), which
is authoritative. Times in ``speech_started`` are the audio appended so far in the session
when the first words of the item were decoded; ``speech_stopped`` uses the final's end.

Client mistakes get an ``error`` event with OpenAI's error shape that names the field, and the
session stays open; a refusal for lack of capacity closes it (1013).

The transcription's ``prompt`` and ``hotwords`` (`backend.realtime_session`) apply to the
turns opened after the update and, from its next chunk on, to the one open. With ``include``
``item.input_audio_transcription.logprobs``, ``completed`` carries ``logprobs`` in OpenAI's
shape, one entry per word of the transcript: ``{"token", "logprob", "bytes"}``, the log of
the word's confidence (`oasr.engine.events.Word`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.config import ServerConfig
from backend.limits import JsonTooDeep, loads_bounded
from backend.protocol import CloseCode
from backend.realtime_session import RealtimeError, TranscriptionSettings, apply_update
from oasr.decoding.context import HotwordError, Hotwords
from oasr.engine import EngineThread
from oasr.engine.events import BUSY, Done, Error, Final, Partial, StreamEvent, Word

# What sending to / receiving from a socket whose client has gone away raises (Starlette raises
# RuntimeError for a socket already closed)
_GONE = (WebSocketDisconnect, RuntimeError, OSError)
MAX_QUEUED_EVENTS = 64  # client events read ahead of processing (back-pressure beyond)
UPDATE_TYPES = ("session.update", "transcription_session.update")
BUFFER_TYPES = ("input_audio_buffer.append", "input_audio_buffer.commit",
                "input_audio_buffer.clear")


@dataclass
class Turn:
    """One engine stream of the session and the items it produced."""

    stream_id: int
    manual: bool
    base_ms: float  # session audio appended before this stream opened
    num_bytes: int = 0
    committed: bool = False  # no more audio: ended by a commit (or the engine)
    cleared: bool = False
    items: dict[int, str] = field(default_factory=dict)  # segment -> item id (server VAD)
    sent: dict[str, str] = field(default_factory=dict)  # item id -> text sent as deltas
    finals: list[str] = field(default_factory=list)  # manual: the finals so far
    words: list[Word] = field(default_factory=list)  # manual: the finals' words so far
    item_id: str = ""  # manual: the turn's one item


class _ClientGone(Exception):
    """A send failed: the client has left (the session ends quietly)."""


class _Close(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class RealtimeConnection:
    """Runs one accepted realtime socket until the client leaves or the session must end.

    Invariant: every stream this connection opened is ended by the engine or aborted here
    when ``run`` returns.
    """

    def __init__(self, websocket: WebSocket, engine: EngineThread, config: ServerConfig) -> None:
        self.websocket = websocket
        self.engine = engine
        self.config = config
        self.max_event_bytes = 2 * config.max_frame_bytes
        self.settings = TranscriptionSettings()
        self.hotwords: Hotwords | None = None  # the settings' prompt and hotwords, spelled
        self.session_id = "sess_" + secrets.token_hex(8)
        self.turns: dict[int, Turn] = {}
        self.open_turn: Turn | None = None
        self.previous_item: str | None = None
        self.audio_ms = 0.0
        self.beta = False
        self._event_ids = itertools.count(1)
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        # a client that sends faster than we answer (or never reads) waits for room here
        self._client_slots = asyncio.Semaphore(MAX_QUEUED_EVENTS)
        self._loop = asyncio.get_running_loop()

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            intent = self.websocket.query_params.get("intent", "transcription")
            if intent != "transcription":
                await self._send_error(RealtimeError(
                    f"intent {intent!r}: oasr serves transcription sessions only "
                    "(?intent=transcription)", "intent"))
                raise _Close(CloseCode.POLICY_VIOLATION)
            await self._send({"type": "session.created", "session": self._session_json()})
            await self._process()
        except _Close as close:
            with contextlib.suppress(*_GONE):
                await self.websocket.close(close.code)
        except _ClientGone:  # only a failed send: any other error is a fault, logged by uvicorn
            pass
        finally:
            reader.cancel()
            for turn in self.turns.values():
                self.engine.abort_stream(turn.stream_id)  # no-op for finished streams
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    # -- plumbing ----------------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            while True:
                await self._client_slots.acquire()
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self._inbox.put_nowait(("client", message))
        except _GONE:
            pass
        self._inbox.put_nowait(("gone", None))

    def _sink(self, event: StreamEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, ("engine", event))

    async def _process(self) -> None:
        started = time.monotonic()
        while True:
            idle = not self.turns
            try:
                kind, item = await asyncio.wait_for(
                    self._inbox.get(), self.config.engine.idle_timeout_s if idle else None)
            except asyncio.TimeoutError:
                await self._send_error(RealtimeError(
                    f"nothing received for {self.config.engine.idle_timeout_s:g} s",
                    code="timeout"))
                raise _Close(CloseCode.POLICY_VIOLATION) from None
            if kind == "gone":
                return
            if kind == "engine":
                await self._on_engine(item)
            else:
                await self._on_client(item)
                self._client_slots.release()
            if time.monotonic() - started > self.config.engine.max_session_s:
                await self._send_error(RealtimeError(
                    f"the session reached its {self.config.engine.max_session_s:g} s limit",
                    code="session_expired"))
                raise _Close(CloseCode.NORMAL)

    async def _send(self, event: dict[str, Any]) -> None:
        text = json.dumps({"event_id": f"event_{next(self._event_ids)}", **event},
                          ensure_ascii=False)
        try:
            await self.websocket.send_text(text)
        except _GONE as exc:
            raise _ClientGone from exc

    async def _send_error(self, error: RealtimeError) -> None:
        await self._send({"type": "error", "error": error.to_error()})

    def _session_json(self) -> dict[str, Any]:
        endpoint = self.engine.engine.config.endpoint
        rule2 = endpoint.rule2 if endpoint is not None else None
        engine_ms = round(rule2.min_trailing_silence_s * 1000) if rule2 is not None else 1000
        return self.settings.session_json(self.session_id, engine_ms, self.beta)

    # -- client events -----------------------------------------------------------------------
    async def _on_client(self, message: dict[str, Any]) -> None:
        event_id = None
        try:
            event = self._parse(message)
            event_id = event.get("event_id")
            await self._dispatch(event)
        except RealtimeError as error:
            error.event_id = error.event_id or (event_id if isinstance(event_id, str) else None)
            await self._send_error(error)

    def _parse(self, message: dict[str, Any]) -> dict[str, Any]:
        text = message.get("text")
        if text is None:
            raise RealtimeError("binary frames are not part of the protocol: send JSON events "
                                "with base64 audio (input_audio_buffer.append)")
        if len(text) > self.max_event_bytes:
            raise RealtimeError(f"event of {len(text)} bytes; the limit is "
                                f"{self.max_event_bytes}: append audio in smaller pieces",
                                code="too_large")
        try:  # bounded: json.loads recurses, and a RecursionError would end the session
            event = loads_bounded(text, self.config.max_json_depth)
        except JsonTooDeep as exc:
            raise RealtimeError(f"the event is rejected: {exc}", code="invalid_json") from None
        except ValueError as exc:
            raise RealtimeError(f"the event is not JSON: {exc}", code="invalid_json") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise RealtimeError("an event must be a JSON object with a string 'type'", "type")
        return event

    async def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in UPDATE_TYPES:
            await self._update(event)
        elif kind in BUFFER_TYPES:
            allowed = {"type", "event_id", "audio"} if kind.endswith("append") else {
                "type", "event_id"}
            unknown = sorted(set(event) - allowed)
            if unknown:
                raise RealtimeError(f"unknown fields {unknown} in {kind}", unknown[0],
                                    code="unknown_parameter")
            handler = {"input_audio_buffer.append": self._append,
                       "input_audio_buffer.commit": self._commit,
                       "input_audio_buffer.clear": self._clear}[kind]
            await handler(event)
        else:
            raise RealtimeError(
                f"event type {kind!r} is not supported by a transcription session; use "
                f"{', '.join(UPDATE_TYPES + BUFFER_TYPES)}", "type", code="unknown_event")

    async def _update(self, event: dict[str, Any]) -> None:
        unknown = sorted(set(event) - {"type", "event_id", "session"})
        if unknown:
            raise RealtimeError(f"unknown fields {unknown} in {event['type']}", unknown[0],
                                code="unknown_parameter")
        settings = apply_update(self.settings, event)
        bias = settings.prompt, settings.hotwords
        hotwords = self.hotwords
        if bias != (self.settings.prompt, self.settings.hotwords):
            try:  # spelled in the served model's units
                hotwords = self.engine.hotwords(settings.hotwords, settings.prompt)
            except HotwordError as exc:
                raise RealtimeError(str(exc), "session.audio.input.transcription.hotwords",
                                    code="bad_hotwords") from None
        stream_bound = (settings.sample_rate, settings.server_vad, settings.silence_ms)
        if self.open_turn is not None and stream_bound != (
                self.settings.sample_rate, self.settings.server_vad, self.settings.silence_ms):
            raise RealtimeError("the audio format and turn detection cannot change while the "
                                "input audio buffer holds audio: commit or clear it first",
                                "session", code="session_busy")
        self.settings = settings
        if hotwords is not self.hotwords:
            self.hotwords = hotwords
            if self.open_turn is not None:  # the open turn's next chunk on
                with contextlib.suppress(KeyError):
                    self.engine.set_hotwords(self.open_turn.stream_id, hotwords)
        self.beta = event["type"] == "transcription_session.update"
        kind = "transcription_session.updated" if self.beta else "session.updated"
        await self._send({"type": kind, "session": self._session_json()})

    async def _append(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise RealtimeError("'audio' must be a base64 string of s16le PCM", "audio")
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RealtimeError(f"'audio' is not valid base64: {exc}", "audio",
                                code="invalid_base64") from None
        if not pcm:
            return
        turn = self.open_turn or self._open_turn()
        try:
            self.engine.feed_audio(turn.stream_id, pcm)
        except ValueError as exc:
            raise RealtimeError(f"bad audio: {exc}", "audio", code="bad_audio") from None
        except KeyError:  # the engine ended that stream (idle, length): start another
            self.open_turn = None
            turn = self._open_turn()
            self.engine.feed_audio(turn.stream_id, pcm)
        turn.num_bytes += len(pcm)
        self.audio_ms += len(pcm) / 2 / self.settings.sample_rate * 1000

    def _open_turn(self) -> Turn:
        settings = self.settings
        silence_s = settings.silence_ms / 1000 if settings.silence_ms is not None else None
        try:
            stream_id = self.engine.open_stream(settings.sample_rate, "s16le", self._sink,
                                                endpoint_silence_s=silence_s,
                                                hotwords=self.hotwords or None)
        except RuntimeError as exc:  # the engine loop died: the server is exiting
            raise RealtimeError(f"transcription is unavailable: {exc}", code="internal",
                                error_type="server_error") from None
        turn = Turn(stream_id, manual=not settings.server_vad, base_ms=self.audio_ms)
        if turn.manual:
            turn.item_id = _item_id()
        self.turns[stream_id] = turn
        self.open_turn = turn
        return turn

    async def _commit(self, event: dict[str, Any]) -> None:
        turn = self.open_turn
        if turn is None or turn.num_bytes == 0:
            raise RealtimeError("the input audio buffer is empty: append audio before a commit",
                                code="input_audio_buffer_commit_empty")
        self.open_turn = None
        turn.committed = True
        self.engine.end_stream(turn.stream_id)
        if turn.manual:
            await self._send_committed(turn.item_id)

    async def _clear(self, event: dict[str, Any]) -> None:
        turn = self.open_turn
        if turn is not None:
            self.open_turn = None
            turn.cleared = True
            self.engine.abort_stream(turn.stream_id)
        await self._send({"type": "input_audio_buffer.cleared"})

    # -- engine events -----------------------------------------------------------------------
    async def _on_engine(self, event: StreamEvent) -> None:
        turn = self.turns.get(event.stream_id)
        if turn is None:
            return
        if event.is_terminal:
            del self.turns[event.stream_id]
            if self.open_turn is turn:
                self.open_turn = None
        if turn.cleared:
            return
        match event:
            case Partial():
                await self._on_partial(turn, event)
            case Final():
                await self._on_final(turn, event)
            case Error():
                await self._on_error(turn, event)
            case Done() if turn.manual:
                await self._on_manual_done(turn)

    async def _on_manual_done(self, turn: Turn) -> None:
        """The engine ended a manually committed buffer's stream: complete its item."""
        if not turn.committed:  # the engine ended the buffer (idle, length): commit it
            turn.committed = True
            await self._send_committed(turn.item_id)
        await self._send_completed(turn.item_id, " ".join(turn.finals),
                                   turn.num_bytes / 2 / self.settings.sample_rate, turn.words)

    async def _on_partial(self, turn: Turn, event: Partial) -> None:
        if turn.manual:
            await self._send_delta(turn, turn.item_id, " ".join([*turn.finals, event.text]).strip())
            return
        if not event.text:
            return
        item_id = turn.items.get(event.segment)
        if item_id is None:
            item_id = turn.items[event.segment] = _item_id()
            await self._send({"type": "input_audio_buffer.speech_started",
                              "audio_start_ms": round(self.audio_ms), "item_id": item_id})
        await self._send_delta(turn, item_id, event.text)

    async def _send_delta(self, turn: Turn, item_id: str, partial: str) -> None:
        text = partial[:partial.rfind(" ") + 1]  # whole words only: the last may change
        sent = turn.sent.get(item_id, "")
        if len(text) > len(sent) and text.startswith(sent):
            turn.sent[item_id] = text
            await self._send({"type": "conversation.item.input_audio_transcription.delta",
                              "item_id": item_id, "content_index": 0,
                              "delta": text[len(sent):]})

    async def _on_final(self, turn: Turn, event: Final) -> None:
        if turn.manual:
            if event.text:
                turn.finals.append(event.text)
                turn.words += event.words
            return
        item_id = turn.items.get(event.segment)
        if item_id is None:
            if not event.text:
                return  # nothing was heard in this segment
            item_id = turn.items[event.segment] = _item_id()
            await self._send({"type": "input_audio_buffer.speech_started",
                              "audio_start_ms": round(turn.base_ms + event.start * 1000),
                              "item_id": item_id})
        await self._send({"type": "input_audio_buffer.speech_stopped",
                          "audio_end_ms": round(turn.base_ms + event.end * 1000),
                          "item_id": item_id})
        await self._send_committed(item_id)
        await self._send_completed(item_id, event.text, max(0.0, event.end - event.start),
                                   event.words)

    async def _on_error(self, turn: Turn, event: Error) -> None:
        if event.code == BUSY:
            await self._send_error(RealtimeError(
                f"the server is busy: {event.message}; retry later", code="busy"))
            raise _Close(CloseCode.TRY_AGAIN_LATER)
        error = {"type": "server_error", "code": event.code, "message": event.message,
                 "param": None}
        items = [turn.item_id] if turn.manual and turn.committed else [
            i for s, i in turn.items.items()]
        for item_id in items:
            await self._send({"type": "conversation.item.input_audio_transcription.failed",
                              "item_id": item_id, "content_index": 0, "error": error})
        await self._send_error(RealtimeError(f"transcription failed: {event.message}",
                                             code=event.code))

    async def _send_committed(self, item_id: str) -> None:
        await self._send({"type": "input_audio_buffer.committed", "item_id": item_id,
                          "previous_item_id": self.previous_item})
        self.previous_item = item_id

    async def _send_completed(self, item_id: str, transcript: str, seconds: float,
                              words: Sequence[Word] = ()) -> None:
        completed: dict[str, Any] = {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": item_id, "content_index": 0, "transcript": transcript,
            "usage": {"type": "duration", "seconds": round(seconds, 3)}}
        if self.settings.logprobs:
            completed["logprobs"] = word_logprobs(words)
        await self._send(completed)


def word_logprobs(words: Sequence[Word]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs`` of a transcript: one entry per word (its text, with the space
    before it from the second word on), the log of its confidence and its UTF-8 bytes."""
    entries = []
    for i, word in enumerate(words):
        token = word.word if i == 0 else " " + word.word
        entries.append({"token": token, "logprob": round(math.log(max(word.confidence, 1e-6)), 4),
                        "bytes": list(token.encode("utf-8"))})
    return entries


def _item_id() -> str:
    return "item_" + secrets.token_hex(8)
