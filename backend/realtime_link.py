"""The socket side of a ``/v1/realtime`` session, which may change sockets: oasr's ``resume``
extension (`backend.resume`, `backend.openai_realtime`).

A session's events are numbered as they are sent (``event_N``). `ClientLink` sends them on the
session's current socket, keeps the latest ``MAX_KEPT_EVENTS`` it sent (a resume naming the last
event its client received gets the ones after it again: a socket that died unnoticed swallowed
them) and holds those it could not send (no socket while the client is away, or a failed send)
for the next socket. Each socket has a reader task that hands its messages to the session's inbox
as ``("client", (websocket, message))`` and ends with ``("gone", (websocket, close_code))``
(close code None when the socket failed without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

MAX_KEPT_EVENTS = 512
# What sending to / receiving from a socket whose client has gone away raises (Starlette raises
# RuntimeError for a socket already closed)
_GONE = (WebSocketDisconnect, RuntimeError, OSError)
# events not kept for replay: a resumed session.created is sent anew, with a new token
_NOT_REPLAYED = ("session.created",)


class ClientLink:
    """A realtime session's current socket, or none while its client is away. Event-loop only.

    Invariant: every socket attached has a future in ``_over``, resolved (the socket's handler
    returns) when the session is done with that socket: detached, taken over, or ended.
    """

    def __init__(self, inbox: asyncio.Queue[tuple[str, Any]], slots: asyncio.Semaphore,
                 room: Callable[[], Awaitable[None]] | None = None) -> None:
        """``inbox``: the session's queue; ``slots``: client messages read ahead of the
        session (the session releases one per client message it has handled); ``room``:
        awaited before each message is read (the audio flow gate: a socket whose stream has
        too much audio queued is not read, and TCP pushes back on its client)."""
        self.websocket: WebSocket | None = None
        self._inbox = inbox
        self._slots = slots
        self._room = room
        self._reader: asyncio.Task[None] | None = None
        self._over: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self._sent: deque[tuple[str, str]] = deque(maxlen=MAX_KEPT_EVENTS)
        self._held: list[tuple[str, str]] = []

    def attach(self, websocket: WebSocket) -> asyncio.Future[None]:
        """Read and send on ``websocket`` from now; returns the future its handler awaits."""
        self.websocket = websocket
        over = asyncio.get_running_loop().create_future()
        self._over[id(websocket)] = over
        self._reader = asyncio.create_task(self._read(websocket))
        return over

    def detach(self) -> None:
        """The socket is gone (its reader said so): events are held from now."""
        if self.websocket is not None:
            self._done_with(self.websocket)
        self.websocket = None
        self._reader = None

    async def take_over(self, websocket: WebSocket, code: int) -> asyncio.Future[None]:
        """``websocket`` replaces a socket the session still holds (its client came back
        before the server noticed the old one had died): the old one is closed with ``code``."""
        old, reader = self.websocket, self._reader
        if reader is not None:
            reader.cancel()
        if old is not None:
            with contextlib.suppress(*_GONE):
                await old.close(code)
            self._done_with(old)
        return self.attach(websocket)

    async def end(self, close_code: int | None, error: BaseException | None = None) -> None:
        """The session is over: stop reading, close the socket with ``close_code`` (None:
        leave it; the client left), and let every handler return (raising ``error``, a fault,
        for the server's log)."""
        if self._reader is not None:
            self._reader.cancel()
        if self.websocket is not None and close_code is not None:
            with contextlib.suppress(*_GONE):
                await self.websocket.close(close_code)
        for over in self._over.values():
            if not over.done():
                if error is None:
                    over.set_result(None)
                else:
                    over.set_exception(error)
        self._over.clear()

    async def send(self, event: dict[str, Any]) -> None:
        """Number ``event`` and send it, or hold it for the next socket."""
        event_id = f"event_{next(self._ids)}"
        text = json.dumps({"event_id": event_id, **event}, ensure_ascii=False)
        await self._send(event_id, text, keep=event.get("type") not in _NOT_REPLAYED)

    async def resend(self, last_event_id: str | None) -> None:
        """After a resume: the events sent after ``last_event_id`` (all those kept when it is
        not among them; none without it), then those held."""
        again: list[tuple[str, str]] = []
        if last_event_id is not None:
            ids = [event_id for event_id, _ in self._sent]
            start = ids.index(last_event_id) + 1 if last_event_id in ids else 0
            again = list(self._sent)[start:]
            self._sent = deque(list(self._sent)[:start], maxlen=MAX_KEPT_EVENTS)
        held, self._held = self._held, []
        for event_id, text in (*again, *held):
            await self._send(event_id, text, keep=True)

    async def _send(self, event_id: str, text: str, keep: bool) -> None:
        websocket = self.websocket
        if websocket is None:
            self._held.append((event_id, text))
            return
        try:
            await websocket.send_text(text)
        except _GONE:  # the socket is gone: its reader tells the session how
            self._held.append((event_id, text))
            return
        if keep:
            self._sent.append((event_id, text))

    def _done_with(self, websocket: WebSocket) -> None:
        over = self._over.pop(id(websocket), None)
        if over is not None and not over.done():
            over.set_result(None)

    async def _read(self, websocket: WebSocket) -> None:
        code: int | None = None
        try:
            while True:
                if self._room is not None:
                    await self._room()
                await self._slots.acquire()
                try:
                    message = await websocket.receive()
                except BaseException:
                    self._slots.release()
                    raise
                if message["type"] == "websocket.disconnect":
                    self._slots.release()
                    code = message.get("code")
                    break
                self._inbox.put_nowait(("client", (websocket, message)))
        except _GONE:
            pass
        self._inbox.put_nowait(("gone", (websocket, code)))
