"""Websocket keepalive that backpressure cannot trip.

uvicorn pings every websocket and closes it (1011 "keepalive ping timeout") when the pong does
not come back in time. A pong is a frame in the same TCP stream as the client's audio, behind
every frame the client sent before it; and uvicorn reads a socket only while the app takes its
messages (after each message it stops reading until the app asks for the next). When the
server's flow control (`backend.limits.AudioFlowGate`) holds a sender back, the server is the
one not reading: the pong waits, unread, behind audio the server has not taken yet, and a
client doing nothing wrong was cut after ``ping_interval + ping_timeout`` (40 s by default).

`BackpressureKeepaliveProtocol` keeps uvicorn's pings but counts a pong's deadline only over the
time the server was reading the socket: while a received message waits for the app, the clock
stops. A client that is gone still misses its pong once the server reads again (the app takes
the queued messages as the engine decodes them), and is closed as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn._types import ASGIReceiveEvent
from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

Clock = Callable[[], float]


class ReadingClock:
    """Seconds a socket was read since `start`: stopped while the server holds reading back.

    ``clock`` is any monotonic clock in seconds (the event loop's ``time`` in the server).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._counted = 0.0  # reading time before the current run
        self._since: float | None = None  # when the current reading run began (None: held)
        self._held = False

    def start(self) -> None:
        """Count from zero (a ping was sent); held if the server is holding reading now."""
        self._counted = 0.0
        self._since = None if self._held else self._clock()

    def hold(self) -> None:
        """The server stopped reading the socket (a message waits for the app)."""
        if self._since is not None:
            self._counted += self._clock() - self._since
            self._since = None
        self._held = True

    def release(self) -> None:
        """The server reads the socket again."""
        if self._held:
            self._held = False
            self._since = self._clock()

    @property
    def is_held(self) -> bool:
        return self._held

    def elapsed(self) -> float:
        """Reading time since `start`, in seconds."""
        running = 0.0 if self._since is None else self._clock() - self._since
        return self._counted + running


class BackpressureKeepaliveProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websocket protocol whose pong deadline counts reading time only.

    uvicorn arms ``pong_timer`` (``ping_timeout`` seconds) when it sends a ping, pauses reading
    in ``send_receive_event_to_app`` (``read_paused``) and resumes it in ``receive``. Here the
    timer, when it fires, closes the connection only if the socket was read for
    ``ping_timeout`` seconds since the ping; otherwise it is re-armed for the reading time
    still owed, counted from when reading resumes.
    """

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.reading = ReadingClock(self.loop.time)

    def send_keepalive_ping(self) -> None:
        super().send_keepalive_ping()
        self.reading.start()

    def send_receive_event_to_app(self) -> None:
        super().send_receive_event_to_app()
        if self.read_paused and not self.reading.is_held:
            self.reading.hold()

    async def receive(self) -> ASGIReceiveEvent:
        message = await super().receive()
        if not self.read_paused and self.reading.is_held:
            self.reading.release()
            self._rearm_pong_timer()
        return message

    def keepalive_timeout(self) -> None:
        if self.ping_timeout is not None and self.pending_ping_payload is not None:
            if self.reading.is_held:  # re-armed when reading resumes; a placeholder till then
                self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)
                return
            owed = self.ping_timeout - self.reading.elapsed()
            if owed > 0:
                self.pong_timer = self.loop.call_later(owed, self.keepalive_timeout)
                return
        super().keepalive_timeout()

    def _rearm_pong_timer(self) -> None:
        if self.pong_timer is None or self.ping_timeout is None:
            return  # no pong awaited
        self.pong_timer.cancel()
        owed = max(0.0, self.ping_timeout - self.reading.elapsed())
        self.pong_timer = self.loop.call_later(owed, self.keepalive_timeout)
