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

A session without a turn in flight holds no engine stream, so it stays open however long it is
quiet, until ``--max-session``; a turn's stream keeps the engine's protections (no audio for
``--idle-timeout`` ends it: a manual buffer is then committed as it stands). With server VAD,
``idle_timeout_ms`` sends ``input_audio_buffer.timeout_triggered`` when no speech was heard for
that long (wall time since the session began, the last item ended or the last timeout; the
audio appended meanwhile is its ``audio_start_ms``..``audio_end_ms``) and commits an empty item
(``committed``, then ``completed`` with transcript ""). A commit with no audio since the last
one (server VAD's included) is the error ``input_audio_buffer_commit_empty``; a commit with
audio is always answered by an item.

Resume, an oasr extension (`backend.resume`, `backend.realtime_link`): ``session.created``
carries ``resume_token`` and ``resume_window_s``. When the socket drops (no close frame, or a
close code other than 1000 / 1001), the session goes on without it for the window: the open
turn's stream is suspended, turns in flight finish, events are held. Connecting to
``/v1/realtime?intent=transcription&resume=TOKEN`` (and ``&last_event_id=event_N``, the last
event received) takes the session over: ``session.created`` with ``resumed: true`` and
``received_samples`` (s16le samples of appended audio the session holds: append the rest), the
events after ``last_event_id`` the old socket carried, then those held. Not resumed in time, the
session ends and its open turn's stream ends ``abandoned``.

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
import json
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.config import ServerConfig
from backend.limits import AudioFlowGate, JsonTooDeep, loads_bounded
from backend.protocol import CloseCode
from backend.realtime_link import ClientLink
from backend.realtime_session import RealtimeError, TranscriptionSettings, apply_update
from backend.resume import ResumeRegistry, is_drop
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
MIN_COMMIT_MS = 100  # with server VAD, less audio than this since its last commit is empty


@dataclass
class Turn:
    """One engine stream of the session and the items it produced."""

    stream_id: int
    manual: bool
    base_ms: float  # session audio appended before this stream opened
    num_bytes: int = 0
    committed: bool = False  # no more audio: ended by a commit (or the engine)
    cleared: bool = False
    vad_ms: float = 0.0  # server VAD: the session audio its finals have committed up to
    commit_answered: bool = False  # server VAD: an item was committed after the client's commit
    items: dict[int, str] = field(default_factory=dict)  # segment -> item id (server VAD)
    sent: dict[str, str] = field(default_factory=dict)  # item id -> text sent as deltas
    finals: list[str] = field(default_factory=list)  # manual: the finals so far
    words: list[Word] = field(default_factory=list)  # manual: the finals' words so far
    item_id: str = ""  # manual: the turn's one item


class _SessionOver(Exception):
    """The session ended before a resume could take it over."""


class _Close(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class RealtimeConnection:
    """Runs one accepted realtime socket until the client leaves or the session must end.

    Invariant: every stream this connection opened is ended by the engine or aborted here
    when ``run`` returns.
    """

    def __init__(self, websocket: WebSocket, engine: EngineThread, config: ServerConfig,
                 resumes: ResumeRegistry[RealtimeConnection] | None = None,
                 principal: str | None = None, flow: AudioFlowGate | None = None) -> None:
        """``resumes``: the server's realtime resume tokens (None: no resume); ``principal``:
        the API key the client authenticated with (`backend.auth.Credentials.principal`);
        ``flow``: the server's audio flow gate (None: the socket is read whatever is
        queued)."""
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
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        # a client that sends faster than we answer (or never reads) waits for room here
        self._client_slots = asyncio.Semaphore(MAX_QUEUED_EVENTS)
        self._loop = asyncio.get_running_loop()
        self.resumes: ResumeRegistry[RealtimeConnection] = (
            resumes if resumes is not None else ResumeRegistry(0.0))
        self.principal = principal
        self.flow = flow
        self.link = ClientLink(self._inbox, self._client_slots,
                               room=self._room if flow is not None else None)
        self.received_samples = 0  # s16le samples appended (at the rate each came in)
        self._clock = time.monotonic  # the session limit, idle timeout and resume window's
        self._task: asyncio.Task[None] | None = None  # the session, across its sockets
        self._away_since: float | None = None  # when its client went away (resume window)
        self._speech: set[str] = set()  # server VAD items whose speech started, not stopped
        self._quiet_since = self._clock()  # no speech since (idle_timeout_ms)
        self._quiet_audio_ms = 0.0  # the session audio then
        self._idle_armed: int | None = None  # the idle_timeout_ms the quiet timer runs for

    async def run(self) -> None:
        """Serve a new session on this socket. Returns when the session is over, or when the
        socket dropped and the session waits for a resume (going on in the background)."""
        over = self.link.attach(self.websocket)
        intent = self.websocket.query_params.get("intent", "transcription")
        if intent != "transcription":
            await self._send_error(RealtimeError(
                f"intent {intent!r}: oasr serves transcription sessions only "
                "(?intent=transcription)", "intent"))
            await self.link.end(CloseCode.POLICY_VIOLATION)
            return
        self._task = asyncio.create_task(self._live())
        await over

    async def resume(self, websocket: WebSocket, last_event_id: str | None) -> None:
        """Serve this session, whose token a resume presented, on ``websocket``; returns like
        `run`. The session takes the socket in turn with its other events: what its old
        socket delivered first is handled first."""
        attached: asyncio.Future[asyncio.Future[None]] = self._loop.create_future()
        self._inbox.put_nowait(("attach", (websocket, last_event_id, attached)))
        try:
            over = await attached
        except _SessionOver:
            error = RealtimeError("the session cannot be resumed: it has ended", "resume",
                                  code="resume_expired")
            with contextlib.suppress(*_GONE):
                await websocket.send_text(json.dumps(
                    {"type": "error", "event_id": "event_" + secrets.token_hex(8),
                     "error": error.to_error()}))
                await websocket.close(CloseCode.POLICY_VIOLATION)
            return
        await over

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The session's own task (None before it began): it outlives a dropped socket."""
        return self._task

    # -- plumbing ----------------------------------------------------------------------------
    async def _live(self) -> None:
        """The session from ``session.created`` to its end, across its sockets."""
        close_code: int | None = None
        error: BaseException | None = None
        try:
            await self._send({"type": "session.created", "session": self._session_json(),
                              **self._resume_fields()})
            await self._process()
        except _Close as close:
            close_code = close.code
        except Exception as exc:  # a fault: raised in the socket's handler, for the log
            error = exc
        finally:
            for turn in self.turns.values():
                self.engine.abort_stream(turn.stream_id)  # no-op for finished streams
                self._forget_queue(turn.stream_id)
            self.resumes.end(self, "the session has ended")
            self._refuse_attaches()
            await self.link.end(close_code, error)

    def _refuse_attaches(self) -> None:
        while not self._inbox.empty():
            kind, item = self._inbox.get_nowait()
            if kind == "attach" and not item[2].done():
                item[2].set_exception(_SessionOver())

    def _resume_fields(self) -> dict[str, Any]:
        """A new resume token for ``session.created`` (nothing when resume is off)."""
        if not self.resumes.enabled:
            return {}
        return {"resume_token": self.resumes.issue(self, self.principal),
                "resume_window_s": self.resumes.window_s}

    def _sink(self, event: StreamEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, ("engine", event))

    async def _process(self) -> None:
        started = self._clock()
        while True:
            try:
                kind, item = await asyncio.wait_for(self._inbox.get(), self._quiet_for(started))
            except asyncio.TimeoutError:
                await self._on_quiet(started)
                continue
            if kind == "gone":
                websocket, code = item
                if websocket is not self.link.websocket:
                    continue  # a socket a resume took over
                if not (self.resumes.enabled and is_drop(code)):
                    return
                self._away()
            elif kind == "attach":
                await self._attach(*item)
            elif kind == "engine":
                await self._on_engine(item)
            else:
                websocket, message = item
                if websocket is self.link.websocket:  # not one a resume took over
                    await self._on_client(message)
                self._client_slots.release()
            if self._clock() - started > self.config.engine.max_session_s:
                await self._expire()

    def _quiet_for(self, started: float) -> float:
        """Seconds until the session must act without a message: its limit, the end of its
        resume window, its idle timeout."""
        deadlines = [started + self.config.engine.max_session_s]
        if self._away_since is not None:
            deadlines.append(self._away_since + self.resumes.window_s)
        idle = self._idle_deadline()
        if idle is not None:
            deadlines.append(idle)
        return max(0.0, min(deadlines) - self._clock())

    async def _on_quiet(self, started: float) -> None:
        now = self._clock()
        if now - started >= self.config.engine.max_session_s:
            await self._expire()
        if self._away_since is not None and now - self._away_since >= self.resumes.window_s:
            if self.open_turn is not None:  # suspended: the engine ends it "abandoned"
                self.turns.pop(self.open_turn.stream_id, None)
                self._forget_queue(self.open_turn.stream_id)
            raise _Close(CloseCode.NORMAL)  # nobody came back: the session ends
        idle = self._idle_deadline()
        if idle is not None and now >= idle:
            await self._timeout_triggered()

    async def _expire(self) -> None:
        await self._send_error(RealtimeError(
            f"the session reached its {self.config.engine.max_session_s:g} s limit",
            code="session_expired"))
        raise _Close(CloseCode.NORMAL)

    def _away(self) -> None:
        """The socket dropped: the session waits for a resume (events held meanwhile)."""
        self.link.detach()
        self._away_since = self._clock()
        if self.open_turn is not None:
            self.engine.suspend_stream(self.open_turn.stream_id, self.resumes.window_s)
        self.resumes.away(self)

    async def _attach(self, websocket: WebSocket, last_event_id: str | None,
                      attached: asyncio.Future[asyncio.Future[None]]) -> None:
        """A resume's socket takes the session (from a socket the server still holds, when
        the client came back before the server noticed that one had died)."""
        if self.link.websocket is not None:
            over = await self.link.take_over(websocket, CloseCode.POLICY_VIOLATION)
        else:
            over = self.link.attach(websocket)
            if self.open_turn is not None:
                self.engine.resume_stream(self.open_turn.stream_id)
        self._away_since = None
        attached.set_result(over)
        await self._send({"type": "session.created", "session": self._session_json(),
                          "resumed": True, "received_samples": self.received_samples,
                          **self._resume_fields()})
        await self.link.resend(last_event_id)

    async def _send(self, event: dict[str, Any]) -> None:
        await self.link.send(event)

    # -- server VAD's idle timeout -----------------------------------------------------------
    def _idle_deadline(self) -> float | None:
        """When ``idle_timeout_ms`` fires (None: off, or speech is going on)."""
        idle_ms = self.settings.idle_timeout_ms if self.settings.server_vad else None
        if idle_ms != self._idle_armed:  # set or changed: the quiet counts from now
            self._idle_armed = idle_ms
            self._quiet()
        if idle_ms is None or self._speech:
            return None
        return self._quiet_since + idle_ms / 1000

    def _quiet(self) -> None:
        """No speech from now (the session began, an item ended, a timeout fired)."""
        self._quiet_since = self._clock()
        self._quiet_audio_ms = self.audio_ms

    async def _timeout_triggered(self) -> None:
        """No speech for ``idle_timeout_ms``: as OpenAI does, say so and commit the quiet
        audio as an empty item."""
        item_id = _item_id()
        start_ms, end_ms = round(self._quiet_audio_ms), round(self.audio_ms)
        await self._send({"type": "input_audio_buffer.timeout_triggered",
                          "audio_start_ms": start_ms, "audio_end_ms": end_ms,
                          "item_id": item_id})
        await self._send_committed(item_id)
        await self._send_completed(item_id, "", (end_ms - start_ms) / 1000)
        self._quiet()

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
        self.received_samples += len(pcm) // 2
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
        if not turn.manual and self.audio_ms - max(turn.base_ms, turn.vad_ms) < MIN_COMMIT_MS:
            raise RealtimeError(f"the input audio buffer is empty: server VAD has committed the "
                                f"audio appended so far (a commit needs {MIN_COMMIT_MS} ms "
                                "more)", code="input_audio_buffer_commit_empty")
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

    async def _room(self) -> None:
        """Return once the open turn's stream may take more audio (`AudioFlowGate`): an
        append is read only then, so a client sending faster than the engine decodes is
        slowed by TCP, as on ``/ws/asr``."""
        turn = self.open_turn
        if turn is not None and self.flow is not None:
            await self.flow.wait_for_room(turn.stream_id)

    def _forget_queue(self, stream_id: int) -> None:
        """A turn's stream is over: it no longer counts against the flow gate's budget."""
        if self.flow is not None:
            self.flow.forget(stream_id)

    # -- engine events -----------------------------------------------------------------------
    async def _on_engine(self, event: StreamEvent) -> None:
        turn = self.turns.get(event.stream_id)
        if turn is None:
            return
        if event.is_terminal:
            del self.turns[event.stream_id]
            self._forget_queue(event.stream_id)
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
            case Done():
                await self._on_vad_done(turn)

    async def _on_manual_done(self, turn: Turn) -> None:
        """The engine ended a manually committed buffer's stream: complete its item."""
        if not turn.committed:  # the engine ended the buffer (idle, length): commit it
            turn.committed = True
            await self._send_committed(turn.item_id)
        await self._send_completed(turn.item_id, " ".join(turn.finals),
                                   turn.num_bytes / 2 / self.settings.sample_rate, turn.words)

    async def _on_vad_done(self, turn: Turn) -> None:
        """A server-VAD turn's stream ended: its speech is over, and a commit no final answered
        gets its item (empty: nothing was heard after the last one)."""
        if self._speech.intersection(turn.items.values()):
            self._speech.difference_update(turn.items.values())
            self._quiet()
        if turn.committed and not turn.commit_answered:
            turn.commit_answered = True
            item_id = _item_id()
            await self._send_committed(item_id)
            end_ms = turn.base_ms + turn.num_bytes / 2 / self.settings.sample_rate * 1000
            await self._send_completed(item_id, "", max(0.0, end_ms - max(turn.base_ms,
                                                                          turn.vad_ms)) / 1000)

    async def _on_partial(self, turn: Turn, event: Partial) -> None:
        if turn.manual:
            await self._send_delta(turn, turn.item_id, " ".join([*turn.finals, event.text]).strip())
            return
        if not event.text:
            return
        item_id = turn.items.get(event.segment)
        if item_id is None:
            item_id = turn.items[event.segment] = _item_id()
            self._speech.add(item_id)
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
        turn.vad_ms = max(turn.vad_ms, turn.base_ms + max(event.end, event.decided_at) * 1000)
        item_id = turn.items.get(event.segment)
        heard = item_id is not None
        if item_id is None:
            if not event.text and (not turn.committed or turn.commit_answered):
                return  # nothing was heard in this segment
            item_id = turn.items[event.segment] = _item_id()  # or it answers a commit
            if event.text:
                heard = True
                await self._send({"type": "input_audio_buffer.speech_started",
                                  "audio_start_ms": round(turn.base_ms + event.start * 1000),
                                  "item_id": item_id})
        if heard:
            await self._send({"type": "input_audio_buffer.speech_stopped",
                              "audio_end_ms": round(turn.base_ms + event.end * 1000),
                              "item_id": item_id})
            self._speech.discard(item_id)
            self._quiet()
        turn.commit_answered = turn.committed
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
