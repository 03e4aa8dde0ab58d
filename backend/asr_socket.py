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
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.limits import AudioFlowGate
from backend.protocol import (
    CloseCode,
    EndRequest,
    ProtocolError,
    Session,
    SessionState,
    StartRequest,
    close_code_for,
)
from oasr.engine.events import Error, Ready, StreamEvent


class Engine(Protocol):
    """What a connection needs from the engine thread (``oasr.engine.EngineThread``)."""

    def open_stream(self, sample_rate: int, fmt: str, sink: Any) -> int: ...
    def feed_audio(self, stream_id: int, data: bytes) -> None: ...
    def queued_audio_s(self, stream_id: int) -> float: ...
    def end_stream(self, stream_id: int) -> None: ...
    def abort_stream(self, stream_id: int) -> None: ...


class ReceiverExit(enum.Enum):
    DISCONNECTED = "disconnected"  # the client went away
    HANDED_OVER = "handed_over"  # the sender finishes the connection (error queued or ended)


@dataclass(frozen=True)
class Refusal:
    """A message refused after ``end``: the error is sent, the connection goes on."""

    error: ProtocolError

    def to_json(self) -> dict[str, str]:
        return {**self.error.to_json(),
                "message": f"{self.error.message}; the stream's final and done follow"}


Outgoing = StreamEvent | ProtocolError | Refusal
OFF_LOOP_FRAME_BYTES = 16 * 1024  # 0.5 s of 16 kHz s16le: larger frames decode off the loop
# What sending to / receiving from a socket whose client has gone away raises.
_GONE = (WebSocketDisconnect, RuntimeError, OSError)


class AsrConnection:
    """Runs the protocol for one accepted websocket until it is closed.

    Invariant: once a stream was opened, it is ended by the engine (done / busy) or aborted
    here; ``run`` never returns with the stream still alive in the engine.
    """

    def __init__(self, websocket: WebSocket, engine: Engine, session: Session,
                 idle_timeout_s: float, flow: AudioFlowGate | None = None,
                 replica: str = "") -> None:
        self.websocket = websocket
        self.engine = engine
        self.session = session
        self.idle_timeout_s = idle_timeout_s
        self.flow = flow
        self.replica = replica  # added to the ready message: which server took the stream
        self.stream_id: int | None = None
        self.is_finished = False  # the engine freed the stream (terminal event seen)
        self._loop = asyncio.get_running_loop()
        self._outgoing: asyncio.Queue[Outgoing] = asyncio.Queue()
        self._refused_after_end = False

    async def run(self) -> None:
        receiver = asyncio.create_task(self._receive_loop())
        sender = asyncio.create_task(self._send_loop())
        try:
            await asyncio.wait({receiver, sender}, return_when=asyncio.FIRST_COMPLETED)
            if not sender.done() and receiver.result() is ReceiverExit.HANDED_OVER:
                await sender
        finally:
            receiver.cancel()
            sender.cancel()
            if self.stream_id is not None and not self.is_finished:
                self.engine.abort_stream(self.stream_id)  # before any await: cannot be skipped
            if self.stream_id is not None and self.flow is not None:
                self.flow.forget(self.stream_id)
            for task in (receiver, sender):
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # re-raises a task's own failure, for the server's log

    def _sink(self, event: StreamEvent) -> None:
        """Called on the engine thread: hand the event to this connection's loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._outgoing.put_nowait, event)

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
                return ReceiverExit.DISCONNECTED
            if message["type"] == "websocket.disconnect":
                return ReceiverExit.DISCONNECTED
            try:
                await self._handle(message)
            except ProtocolError as error:
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
            if len(data) > OFF_LOOP_FRAME_BYTES:
                await asyncio.to_thread(self._feed, data)
            else:
                self._feed(data)
            return
        request = self.session.on_text(message.get("text") or "")
        if isinstance(request, StartRequest):
            self._open(request)
        elif isinstance(request, EndRequest) and self.stream_id is not None:
            self.engine.end_stream(self.stream_id)

    def _open(self, start: StartRequest) -> None:
        try:
            self.stream_id = self.engine.open_stream(
                sample_rate=start.sample_rate, fmt=start.fmt, sink=self._sink)
        except ValueError as exc:
            raise ProtocolError("unsupported", str(exc)) from None
        except RuntimeError as exc:  # the engine died between admission and this start
            raise ProtocolError("internal", str(exc)) from None

    def _feed(self, data: bytes) -> None:
        if not data or self.stream_id is None:
            return
        try:
            self.engine.feed_audio(self.stream_id, data)
        except ValueError as exc:
            raise ProtocolError("bad_audio", str(exc)) from None
        except KeyError:
            pass  # the engine already ended the stream (timeout, length): its done is queued

    async def _send_loop(self) -> None:
        close_code = CloseCode.NORMAL
        with contextlib.suppress(*_GONE):
            while True:
                item = await self._outgoing.get()
                if isinstance(item, Refusal):
                    await self.websocket.send_json(item.to_json())
                    continue
                if isinstance(item, ProtocolError):
                    await self._send_and_close(item.to_json(), item.close_code)
                    return
                if isinstance(item, Error):
                    close_code = close_code_for(item.code)
                if item.is_terminal:
                    self.is_finished = True
                    await self._send_and_close(item.to_json(), close_code)
                    return
                message = item.to_json()
                if isinstance(item, Ready) and self.replica:
                    message["replica"] = self.replica
                await self.websocket.send_json(message)

    async def _send_and_close(self, message: dict[str, Any], code: int) -> None:
        await self.websocket.send_json(message)
        await self.websocket.close(code=code)
