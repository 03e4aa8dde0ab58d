"""The stats hub: samples the engine a few times a second for the metrics and ``/ws/stats``.

What it hands out is a `ServedSnapshot`: the engine's `EngineSnapshot` and the server's own
counts (`ServerSnapshot`), read by field here and serialised once, at the socket
(``to_json()``: the JSON ``/api/stats`` serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.prometheus import ServerMetrics
from oasr.engine.snapshot import EngineSnapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSnapshot:
    """The server's side of the stats: connections, drain and audio flow."""

    connections: int  # /ws/asr
    max_connections: int
    realtime_connections: int
    stats_viewers: int
    replica: str
    draining: bool
    drain_seconds_left: float | None  # None while serving
    queued_audio_s: float
    num_flow_pauses: int


@dataclass(frozen=True)
class ServedSnapshot:
    """What ``/api/stats`` and ``/ws/stats`` serve: the engine's snapshot and the server's."""

    engine: EngineSnapshot
    server: ServerSnapshot

    def to_json(self) -> dict[str, Any]:
        return {**self.engine.to_json(), "server": asdict(self.server)}


Snapshot = ServedSnapshot


class StatsHub:
    """Polls ``stats()`` every ``interval_s`` and hands the latest snapshot to each subscriber.

    Each subscriber has a one-slot queue that always holds the newest snapshot: a slow
    ``/ws/stats`` client skips snapshots instead of growing a backlog.
    """

    def __init__(self, stats: Callable[[], Snapshot | None], metrics: ServerMetrics,
                 interval_s: float, send_timeout_s: float = 5.0) -> None:
        self._stats = stats
        self._metrics = metrics
        self.interval_s = interval_s
        self.send_timeout_s = send_timeout_s  # a viewer slower than this is dropped
        self.num_dropped_viewers = 0
        self._subscribers: set[asyncio.Queue[Snapshot]] = set()

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self) -> asyncio.Queue[Snapshot]:
        queue: asyncio.Queue[Snapshot] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Snapshot]) -> None:
        self._subscribers.discard(queue)

    def publish_once(self) -> Snapshot | None:
        """Take one snapshot, feed the metrics with it and push it to every subscriber."""
        snapshot = self._stats()
        if snapshot is None:
            return None
        self._metrics.observe_snapshot(snapshot.engine)
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(snapshot)
        return snapshot

    async def run(self) -> None:
        """Publish forever, every ``interval_s`` seconds (cancel to stop).

        A snapshot that fails to publish is logged and skipped: the panel and the metrics
        keep going with the next one.
        """
        while True:
            try:
                self.publish_once()
            except Exception:
                logger.exception("stats snapshot could not be published")
            await asyncio.sleep(self.interval_s)


async def stream_stats(websocket: WebSocket, hub: StatsHub,
                       first: Snapshot | None) -> None:
    """Push snapshots to an accepted ``/ws/stats`` socket until the client goes away.

    Each send must complete within ``hub.send_timeout_s``: a viewer that stops reading fills
    its TCP window, the send blocks, and the viewer is dropped (its place freed) instead of
    holding it for as long as it likes.
    """
    queue = hub.subscribe()
    watcher = asyncio.create_task(_wait_for_disconnect(websocket))

    async def send(snapshot: Snapshot) -> None:
        await asyncio.wait_for(websocket.send_json(snapshot.to_json()), hub.send_timeout_s)

    try:
        if first is not None:
            await send(first)
        while not watcher.done():
            getter = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            await send(getter.result())
    except asyncio.TimeoutError:  # before OSError: TimeoutError is one
        hub.num_dropped_viewers += 1
        logger.warning("dropped a /ws/stats viewer that did not read for %g s",
                       hub.send_timeout_s)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # the client went away while we were sending
    finally:
        hub.unsubscribe(queue)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _wait_for_disconnect(websocket: WebSocket) -> None:
    """Read (and ignore) what the client sends until it disconnects."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
