"""Bounds on what one client can make the server hold or do: JSON shape, queued audio, slow
HTTP requests.

- `loads_bounded`: JSON control messages are checked for nesting depth before ``json.loads``
  (whose recursion would otherwise raise RecursionError on 2,000 nested brackets).
- `AudioFlowGate`: per-socket backpressure plus a global budget of queued audio. A connection
  asks ``wait_for_room`` before it reads its next frame; while its stream has more than
  ``max_socket_s`` seconds queued and not decoded, or all streams together more than
  ``max_total_s``, it does not read, so uvicorn stops reading the socket and TCP pushes back
  on the client: a flood costs the flooder, not everyone's latency and memory.
- `request_timeout_protocol`: uvicorn's HTTP protocol with a deadline for a request's headers
  and one for its body (`BodyDeadline`), so half-open and trickled requests do not hold
  connections.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

FLOW_POLL_S = 0.02  # how often a paused socket looks at its queue again
# A request body must keep arriving at this rate, on average, after the header timeout's grace
MIN_BODY_BYTES_PER_S = 1000
_TIMEOUT_BODY = b"the request body came too slowly\n"
REQUEST_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                            % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))


class JsonTooDeep(ValueError):
    """A JSON text nests deeper than allowed."""


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """Whether ``text`` opens more than ``max_depth`` nested arrays / objects (brackets inside
    strings do not count). Linear and allocation-free: it runs before any parsing."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loads_bounded(text: str, max_depth: int) -> Any:
    """``json.loads`` for text nesting at most ``max_depth`` levels.

    Raises:
        JsonTooDeep: deeper nesting (checked before parsing).
        ValueError: not JSON.
    """
    if json_depth_exceeds(text, max_depth):
        raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels")
    return json.loads(text)


class AudioFlowGate:
    """Decides when a ``/ws/asr`` connection may read its next message.

    Used from the event loop only. ``queued_s(stream_id)`` reports a stream's audio handed to
    the engine and not decoded yet; the gate keeps a per-stream view of it to bound the sum.

    A check costs the same however many streams there are: a socket looks at its own queue,
    and the other streams' queues are looked at again at most every `FLOW_POLL_S` (``clock``
    seconds) for all the sockets waiting on the global budget together. (Reading every
    stream's queue at every message grows with the square of the streams; behind real time,
    with every socket checking, the event loop would hold the GIL the engine's thread needs
    to drain the queues: docs/benchmarks.md, "The audio flow gate at many clients".)
    """

    def __init__(self, queued_s: Callable[[int], float], max_socket_s: float,
                 max_total_s: float, floor_s: Callable[[], float] = lambda: 1.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < max_socket_s <= max_total_s:
            raise ValueError(f"need 0 < max_socket_s ({max_socket_s}) <= max_total_s "
                             f"({max_total_s})")
        self._queued_s = queued_s
        # A stream with less than floor_s() queued may always send: the engine may need that
        # much for the stream's next chunk, and holding it back would stall the stream for
        # good (nothing to decode, nothing read). Two chunks' worth.
        self._floor_s = floor_s
        self.max_socket_s = max_socket_s
        self.max_total_s = max_total_s
        self._sleep = sleep  # between two looks at a paused socket's queue (tests count them)
        self._clock = clock
        self._queued: dict[int, float] = {}
        self._total = 0.0  # sum(self._queued.values()), kept as entries change
        self._others_at = -math.inf  # when every stream's queue was last looked at
        self.num_pauses = 0  # times a socket had to wait (for the stats)

    @property
    def total_queued_s(self) -> float:
        return self._total

    def _refresh(self, stream_id: int) -> float:
        queued = self._queued_s(stream_id)
        self._total += queued - self._queued.get(stream_id, 0.0)
        self._queued[stream_id] = queued
        return queued

    def _refresh_all(self) -> None:
        """Every stream's queue looked at again, at most every `FLOW_POLL_S`."""
        now = self._clock()
        if now - self._others_at < FLOW_POLL_S:
            return
        self._others_at = now
        for stream_id in self._queued:
            self._queued[stream_id] = self._queued_s(stream_id)
        self._total = sum(self._queued.values())  # (no drift from the running sum)

    def _must_wait(self, stream_id: int) -> bool:
        own = self._refresh(stream_id)
        if own <= self._floor_s():  # what the engine may need for this stream's next chunk
            return False
        if own > self.max_socket_s:
            return True
        # over the global budget, every queued stream waits
        self._refresh_all()
        return self._total > self.max_total_s

    async def wait_for_room(self, stream_id: int) -> None:
        """Return once ``stream_id`` may hand over more audio."""
        if not self._must_wait(stream_id):
            return
        self.num_pauses += 1
        while self._must_wait(stream_id):
            await self._sleep(FLOW_POLL_S)

    def forget(self, stream_id: int) -> None:
        """The connection is gone: its stream no longer counts against the budget."""
        self._total -= self._queued.pop(stream_id, 0.0)
        if not self._queued:
            self._total = 0.0


class BodyDeadline:
    """When a request's body must be complete: ``timeout_s`` after its headers, plus 1 s for
    every ``min_bytes_per_s`` bytes of it received. A client on any real link finishes long
    before; one trickling a few bytes a second runs out at about ``timeout_s``.

    ``clock`` is any monotonic clock in seconds (the event loop's ``time`` in the server).
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float],
                 min_bytes_per_s: float = MIN_BODY_BYTES_PER_S) -> None:
        self.timeout_s = timeout_s
        self.min_bytes_per_s = min_bytes_per_s
        self.num_bytes = 0
        self._clock = clock
        self._started = clock()

    def received(self, num_bytes: int) -> None:
        self.num_bytes += num_bytes

    def seconds_left(self) -> float:
        allowed = self.timeout_s + self.num_bytes / self.min_bytes_per_s
        return self._started + allowed - self._clock()


def _body_pending(cycle: Any) -> bool:
    """A request (uvicorn's ``RequestResponseCycle``) still receiving its body."""
    return (cycle is not None and cycle.more_body and not cycle.response_complete
            and not cycle.disconnected)


def request_timeout_protocol(base: type[asyncio.Protocol], timeout_s: float) -> type:
    """``base`` (uvicorn's HTTP protocol class) closing connections whose request is too slow:
    headers not complete ``timeout_s`` seconds after the connection was made, or a body not
    complete by its `BodyDeadline` (answered 408 when no response has started).

    uvicorn times out idle keep-alive connections but neither a request whose headers never
    finish nor a body that never does; a production deployment also sits behind HAProxy
    (``timeout http-request``).
    """

    class RequestTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._loop_time = asyncio.get_running_loop().time
            self._header_deadline = asyncio.get_running_loop().call_later(
                timeout_s, self._on_header_deadline)
            self._body_cycle: Any = None  # the request (cycle) whose body the deadline is for
            self._body_deadline: BodyDeadline | None = None
            self._body_timer: asyncio.TimerHandle | None = None

        def _on_header_deadline(self) -> None:
            transport = self.transport
            if (getattr(self, "cycle", None) is None and not transport.is_closing()
                    and transport.get_protocol() is self):  # not upgraded to a websocket
                transport.close()  # no request started: a half-open request

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # closed, or upgraded to a websocket
            cycle = getattr(self, "cycle", None)
            if not _body_pending(cycle):
                return
            if cycle is self._body_cycle and self._body_deadline is not None:
                self._body_deadline.received(len(data))
                return
            self._body_cycle = cycle  # a new request's headers are complete: its body's turn
            self._body_deadline = BodyDeadline(timeout_s, self._loop_time)
            self._arm_body_timer(timeout_s)

        def _arm_body_timer(self, delay_s: float) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = asyncio.get_running_loop().call_later(
                delay_s, self._on_body_deadline)

        def _on_body_deadline(self) -> None:
            self._body_timer = None
            cycle, deadline = self._body_cycle, self._body_deadline
            if (cycle is None or deadline is None or cycle is not getattr(self, "cycle", None)
                    or not _body_pending(cycle) or self.transport.is_closing()):
                return  # the body came (or the request is over)
            left = deadline.seconds_left()
            if left > 0:
                self._arm_body_timer(left)
                return
            if not self._body_cycle.response_started:
                self.transport.write(REQUEST_TIMEOUT_RESPONSE)
            self.transport.close()  # the app's receive() now says http.disconnect

        def connection_lost(self, exc: Exception | None) -> None:
            self._header_deadline.cancel()
            if self._body_timer is not None:
                self._body_timer.cancel()
            super().connection_lost(exc)

    RequestTimeoutProtocol.__name__ = f"RequestTimeout{base.__name__}"
    return RequestTimeoutProtocol
