"""One ``/ws/asr`` connection: client messages in, engine events out.

Two tasks per connection. The receiver parses client messages through ``Session`` and forwards
audio to the engine (frames over ``OFF_LOOP_FRAME_BYTES`` are decoded and resampled on a
worker thread, so one big frame cannot stall every other connection; and it reads nothing while
the flow gate says its stream has enough audio queued: backpressure); the sender is the only task that writes to the socket: it sends each
engine event (delivered from the engine thread through ``call_soon_threadsafe``) and the
receiver's protocol errors, and closes the socket after the stream's last event.

A protocol error ends the connection, except after the client's ``end``: then the stream's audio
is all there, and a message the client sends on (audio after end, a second end) is refused with
an error (the first one; later ones are dropped unanswered) while the final and done follow.

Resume (`backend.resume`): a stream outlives a dropped socket. What a stream keeps across its
connections is its `StreamState` (protocol state, audio samples received, events not sent, the
finals sent). ``ready`` carries a ``resume_token``; when the socket drops (not after ``end``,
not a close with 1000 or 1001) the stream is suspended in the engine for the resume window and
its events are held. ``{"type": "start", "resume": TOKEN, "last_final": N}`` on a new socket
takes it over: ``ready`` with ``resumed: true`` and ``received_samples``, then the finals after
segment N that were sent on the old socket (without ``last_final``: those whose send failed),
then the events held. A token presented while the old socket still looks alive (the server has
not noticed the drop yet) takes the stream from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.limits import AudioFlowGate
from backend.protocol import (
    CloseCode,
    EndRequest,
    HotwordsRequest,
    ProtocolError,
    ResumeRequest,
    Session,
    SessionState,
    StartRequest,
    close_code_for,
)
from backend.resume import ResumeError, ResumeRegistry, is_drop
from oasr.audio import bytes_per_sample
from oasr.decoding.context import HotwordError
from oasr.engine.events import Done, Error, Final, Partial, Ready, StreamEvent


class Engine(Protocol):
    """What a connection needs from the engine thread (``oasr.engine.EngineThread``)."""

    def open_stream(self, sample_rate: int, fmt: str, sink: Any,
                    endpoint_silence_s: float | None = None, hotwords: Any = None) -> int: ...
    def set_hotwords(self, stream_id: int, hotwords: Any) -> Any: ...
    def feed_audio(self, stream_id: int, data: bytes) -> None: ...
    def queued_audio_s(self, stream_id: int) -> float: ...
    def end_stream(self, stream_id: int) -> None: ...
    def abort_stream(self, stream_id: int) -> None: ...
    def suspend_stream(self, stream_id: int, window_s: float) -> None: ...
    def resume_stream(self, stream_id: int) -> None: ...


class ReceiverExit(enum.Enum):
    DISCONNECTED = "disconnected"  # the client went away (closed, or dropped: `_dropped`)
    HANDED_OVER = "handed_over"  # the sender finishes the connection (error queued or ended)


class SenderExit(enum.Enum):
    CLOSED = "closed"  # it sent the last message and closed the socket
    GONE = "gone"  # a send failed: the socket is gone


@dataclass(frozen=True)
class Refusal:
    """A message refused after ``end``: the error is sent, the connection goes on."""

    error: ProtocolError

    def to_json(self) -> dict[str, str]:
        return {**self.error.to_json(),
                "message": f"{self.error.message}; the stream's final and done follow"}


@dataclass(frozen=True)
class Message:
    """A message of this connection's own, sent as it is (a resumed ``ready``)."""

    body: dict[str, Any]


Outgoing = StreamEvent | ProtocolError | Refusal | Message
OFF_LOOP_FRAME_BYTES = 16 * 1024  # 0.5 s of 16 kHz s16le: larger frames decode off the loop
MAX_FINALS_KEPT = 256  # finals sent that a resume may replay (the latest ones)
SENDER_GONE_WAIT_S = 1.0  # after a failed send: how long to wait to hear how the socket ended
# What sending to / receiving from a socket whose client has gone away raises.
_GONE = (WebSocketDisconnect, RuntimeError, OSError)


class StreamState:
    """One ``/ws/asr`` stream as it outlives a connection (resume); event-loop thread only
    (the engine's events come through ``deliver``, called on the loop).

    Invariant: while ``connection`` is None, the events the engine delivers are kept in
    ``held`` (for the connection that resumes the stream); ``finals`` holds the latest finals
    taken for sending, each with whether its send completed.
    """

    def __init__(self, session: Session, on_end: Callable[[StreamState, str], None]) -> None:
        self.session = session
        self.stream_id: int | None = None
        self.bytes_per_sample = 2
        self.received_samples = 0  # audio fed to the engine, in samples at the client's rate
        self.ready: dict[str, Any] | None = None  # the first ready (no token): resumes echo it
        self.is_finished = False  # the engine ended the stream (its terminal event came)
        self.connection: AsrConnection | None = None
        self.held: list[Outgoing] = []
        self.finals: deque[list[Any]] = deque(maxlen=MAX_FINALS_KEPT)  # [Final, sent]
        self._on_end = on_end

    def deliver(self, event: StreamEvent) -> None:
        """An engine event, on the loop: to the attached connection, else held."""
        if event.is_terminal:
            self.is_finished = True
            reason = event.finish_reason if isinstance(event, Done) else "refused"
            self._on_end(self, f"it has ended ({reason})")
        if self.connection is not None:
            self.connection.enqueue(event)
        else:
            self.held.append(event)

    def replay(self, last_final: int | None) -> list[Final]:
        """The finals sent on earlier connections to send again: those after segment
        ``last_final`` (the client's last), or without it those whose send failed. They leave
        the log (sent again, they are logged again); with ``last_final``, so do the ones the
        client holds."""
        again: list[Final] = []
        kept: list[list[Any]] = []
        for entry in self.finals:
            final, sent = entry
            if (final.segment > last_final) if last_final is not None else not sent:
                again.append(final)
            elif last_final is None:
                kept.append(entry)
        self.finals = deque(kept, maxlen=MAX_FINALS_KEPT)
        return again


class AsrConnection:
    """Runs the protocol for one accepted websocket until it is closed.

    Invariant: once a stream was opened, it is ended by the engine (done / busy) or aborted
    here; ``run`` never returns with the stream still alive in the engine.
    """

    def __init__(self, websocket: WebSocket, engine: Engine, session: Session,
                 idle_timeout_s: float, flow: AudioFlowGate | None = None,
                 replica: str = "", resumes: ResumeRegistry[StreamState] | None = None,
                 principal: str | None = None) -> None:
        """``resumes``: the server's resume tokens (None: no resume); ``principal``: the API
        key the client authenticated with (`backend.auth.Credentials.principal`): a token
        is only honoured for the key that opened its stream."""
        self.websocket = websocket
        self.engine = engine
        self.idle_timeout_s = idle_timeout_s
        self.flow = flow
        self.replica = replica  # added to the ready message: which server took the stream
        self.resumes = resumes if resumes is not None else ResumeRegistry[StreamState](0.0)
        self.principal = principal
        self.state = StreamState(session, self.resumes.end)
        self.state.connection = self
        self._loop = asyncio.get_running_loop()
        self._outgoing: asyncio.Queue[Outgoing] = asyncio.Queue()
        self._in_flight: Outgoing | None = None  # taken by the sender, its send not done
        self._refused_after_end = False
        self._dropped = False  # the socket ended without the client closing it on purpose
        self._taken_over = False  # a resume on another socket took the stream
        self._tasks: tuple[asyncio.Task[Any], ...] = ()

    @property
    def session(self) -> Session:
        return self.state.session

    @property
    def stream_id(self) -> int | None:
        return self.state.stream_id

    @property
    def is_finished(self) -> bool:
        """The engine freed the stream (terminal event seen)."""
        return self.state.is_finished

    async def run(self) -> None:
        receiver = asyncio.create_task(self._receive_loop())
        sender = asyncio.create_task(self._send_loop())
        self._tasks = (receiver, sender)
        try:
            await asyncio.wait({receiver, sender}, return_when=asyncio.FIRST_COMPLETED)
            if self._taken_over:
                pass
            elif receiver.done():
                if not sender.done() and receiver.result() is ReceiverExit.HANDED_OVER:
                    await sender
            elif sender.result() is SenderExit.GONE:  # hear how the socket ended
                done, _ = await asyncio.wait({receiver}, timeout=SENDER_GONE_WAIT_S)
                self._dropped = self._dropped or not done
        finally:
            receiver.cancel()
            sender.cancel()
            self._leave()  # before any await: cannot be skipped
            for task in (receiver, sender):
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # re-raises a task's own failure, for the server's log
            if self._taken_over:
                with contextlib.suppress(*_GONE):
                    await self.websocket.close(code=CloseCode.POLICY_VIOLATION)

    def _leave(self) -> None:
        """The connection is over: a dropped client's stream is suspended for it to resume;
        any other is aborted, unless the engine has finished it."""
        state = self.state
        if self._taken_over or state.connection is not self:
            return
        state.connection = None
        if state.stream_id is None:
            return
        if self.flow is not None:
            self.flow.forget(state.stream_id)
        if self._dropped and self._is_resumable():
            state.held = self._undelivered()
            self.engine.suspend_stream(state.stream_id, self.resumes.window_s)
            self.resumes.away(state)
            return
        if not state.is_finished:
            self.engine.abort_stream(state.stream_id)
        self.resumes.end(state, "its client closed the connection")

    def _is_resumable(self) -> bool:
        """A token was handed out, the stream lives, and its client had not sent ``end``."""
        state = self.state
        return (self.resumes.enabled and state.ready is not None and not state.is_finished
                and state.session.state is SessionState.STREAMING)

    def _undelivered(self) -> list[Outgoing]:
        """The engine's events this connection took and did not send, in order. Left out:
        the connection's own messages, a partial or ready whose send was cut (it may have
        gone out; the next partial or the resumed ready replaces it) and a final whose send
        was cut (the finals log replays it)."""
        items = [] if self._in_flight is None else [self._in_flight]
        self._in_flight = None
        if items and isinstance(items[0], (Partial, Ready, Final)):
            items = []
        while not self._outgoing.empty():
            items.append(self._outgoing.get_nowait())
        return [item for item in items
                if not isinstance(item, (ProtocolError, Refusal, Message, Ready))]

    def hand_over(self) -> list[Outgoing]:
        """A resume on another socket takes this connection's stream (its client came back
        before the server noticed this socket had died): stop, and give up what it did not
        send."""
        self._taken_over = True
        for task in self._tasks:
            task.cancel()
        return self._undelivered()

    def enqueue(self, item: Outgoing) -> None:
        self._outgoing.put_nowait(item)

    def _sink(self, event: StreamEvent) -> None:
        """Called on the engine thread: hand the event to the stream's state on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self.state.deliver, event)

    async def _receive_loop(self) -> ReceiverExit:
        while True:
            timeout = self.idle_timeout_s if self.stream_id is None else None
            if self.stream_id is not None and self.flow is not None:
                await self.flow.wait_for_room(self.stream_id)
            try:
                message = await asyncio.wait_for(self.websocket.receive(), timeout)
            except asyncio.TimeoutError:  # before _GONE: TimeoutError is an OSError
                self._outgoing.put_nowait(ProtocolError(
                    "timeout", f"nothing received for {self.idle_timeout_s:g} s"))
                return ReceiverExit.HANDED_OVER
            except _GONE:
                self._dropped = True
                return ReceiverExit.DISCONNECTED
            if message["type"] == "websocket.disconnect":
                self._dropped = is_drop(message.get("code"))
                return ReceiverExit.DISCONNECTED
            try:
                await self._handle(message)
            except ProtocolError as error:
                if error.code == "bad_hotwords" and self.stream_id is not None:
                    self._refuse_hotwords(str(error))  # the stream keeps the ones it had
                    continue
                if self.session.state is SessionState.ENDED and self.stream_id is not None:
                    self._refuse_after_end(error)  # the stream's final is not lost for it
                    continue
                self._outgoing.put_nowait(error)
                return ReceiverExit.HANDED_OVER

    def _refuse_after_end(self, error: ProtocolError) -> None:
        if not self._refused_after_end:  # one answer: a flood after end queues nothing more
            self._refused_after_end = True
            self._outgoing.put_nowait(Refusal(error))

    async def _handle(self, message: MutableMapping[str, Any]) -> None:
        data = message.get("bytes")
        if data is not None:
            start = self.session.on_audio(data)
            if start is not None:
                self._open(start)
            if self.stream_id is not None:  # counted first: a resume taking over mid-feed
                self.state.received_samples += len(data) // self.state.bytes_per_sample
            if len(data) > OFF_LOOP_FRAME_BYTES:
                await asyncio.to_thread(self._feed, data)
            else:
                self._feed(data)
            return
        request = self.session.on_text(message.get("text") or "")
        if isinstance(request, StartRequest):
            self._open(request)
        elif isinstance(request, ResumeRequest):
            self._resume(request)
        elif isinstance(request, HotwordsRequest) and self.stream_id is not None:
            self._set_hotwords(request)
        elif isinstance(request, EndRequest) and self.stream_id is not None:
            self.engine.end_stream(self.stream_id)

    def _set_hotwords(self, request: HotwordsRequest) -> None:
        """Replace the stream's hotwords from its next chunk on and echo what was accepted;
        a term the model cannot spell is refused, the stream keeping the ones it had."""
        assert self.stream_id is not None
        try:
            accepted = self.engine.set_hotwords(self.stream_id, request.hotwords)
        except HotwordError as exc:
            self._refuse_hotwords(str(exc))
            return
        except KeyError:
            return  # the engine already ended the stream: its done is queued
        if self.state.ready is not None:  # a resumed ready echoes the stream's current terms
            self.state.ready["hotwords"] = accepted.to_json()
        self.enqueue(Message({"type": "hotwords", "hotwords": accepted.to_json()}))

    def _refuse_hotwords(self, why: str) -> None:
        self.enqueue(Message({"type": "error", "code": "bad_hotwords",
                              "message": f"{why}; the stream keeps its hotwords"}))

    def _open(self, start: StartRequest) -> None:
        self.state.bytes_per_sample = bytes_per_sample(start.fmt)
        try:
            self.state.stream_id = self.engine.open_stream(
                sample_rate=start.sample_rate, fmt=start.fmt, sink=self._sink,
                hotwords=start.hotwords or None)
        except HotwordError as exc:  # a term the model's units cannot spell
            raise ProtocolError("bad_hotwords", str(exc)) from None
        except ValueError as exc:
            raise ProtocolError("unsupported", str(exc)) from None
        except RuntimeError as exc:  # the engine died between admission and this start
            raise ProtocolError("internal", str(exc)) from None

    def _resume(self, request: ResumeRequest) -> None:
        """Take over the stream of ``request``'s token (see the module docstring)."""
        if not self.resumes.enabled:
            raise ProtocolError("resume_invalid", "this server does not resume streams (its "
                                "--resume-window is 0)")
        try:
            state = self.resumes.claim(request.token, self.principal)
        except ResumeError as exc:
            raise ProtocolError(exc.code, exc.message) from None
        previous = state.connection
        if previous is not None:
            held = previous.hand_over()
        else:
            held, state.held = state.held, []
            assert state.stream_id is not None  # a token is only issued with a ready
            self.engine.resume_stream(state.stream_id)
        state.connection = self
        self.state = state
        assert state.ready is not None
        body = {**state.ready, "resumed": True, "received_samples": state.received_samples,
                "resume_token": self.resumes.issue(state, self.principal),
                "resume_window_s": self.resumes.window_s}
        for item in (Message(body), *state.replay(request.last_final), *held):
            self._outgoing.put_nowait(item)

    def _feed(self, data: bytes) -> None:
        if not data or self.stream_id is None:
            return
        try:
            self.engine.feed_audio(self.stream_id, data)
        except ValueError as exc:  # the connection ends: its count of samples no longer matters
            raise ProtocolError("bad_audio", str(exc)) from None
        except KeyError:
            pass  # the engine already ended the stream (timeout, length): its done is queued

    async def _send_loop(self) -> SenderExit:
        close_code = CloseCode.NORMAL
        try:
            while True:
                item = self._in_flight = await self._outgoing.get()
                if isinstance(item, Refusal | Message):
                    await self.websocket.send_json(
                        item.body if isinstance(item, Message) else item.to_json())
                elif isinstance(item, ProtocolError):
                    await self._send_and_close(item.to_json(), item.close_code)
                    return SenderExit.CLOSED
                else:
                    if isinstance(item, Error):
                        close_code = close_code_for(item.code)
                    if item.is_terminal:
                        await self._send_and_close(item.to_json(), close_code)
                        return SenderExit.CLOSED
                    await self._send_event(item)
                self._in_flight = None
        except _GONE:
            return SenderExit.GONE

    async def _send_event(self, event: StreamEvent) -> None:
        """Send an engine event: a ready gets the replica and a resume token, a final is
        logged for a resume to replay."""
        message = event.to_json()
        if isinstance(event, Ready):
            if self.replica:
                message["replica"] = self.replica
            if self.resumes.enabled:
                self.state.ready = dict(message)
                message["resume_token"] = self.resumes.issue(self.state, self.principal)
                message["resume_window_s"] = self.resumes.window_s
        if isinstance(event, Final):
            entry = [event, False]
            self.state.finals.append(entry)
            await self.websocket.send_json(message)
            entry[1] = True
            return
        await self.websocket.send_json(message)

    async def _send_and_close(self, message: dict[str, Any], code: int) -> None:
        await self.websocket.send_json(message)
        await self.websocket.close(code=code)
