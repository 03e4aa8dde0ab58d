"""One engine stream seen from asyncio: commands out, events in on an asyncio queue.

The OpenAI endpoints use this to drive the same ``EngineThread`` streams that ``/ws/asr``
does: the engine thread calls the sink, which hands each event to the owning event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeGuard

import numpy as np

from oasr.decoding.context import Hotwords
from oasr.engine import EngineThread
from oasr.engine.events import BUSY, Error, StreamEvent

PACE_POLL_S = 0.05


class EngineStream:
    """An open engine stream owned by one asyncio task.

    Invariant: after ``close`` the stream has ended in the engine (terminal event seen) or was
    aborted; ``close`` is safe to call more than once.
    """

    events: asyncio.Queue[StreamEvent | Exception]

    def __init__(self, engine: EngineThread, sample_rate: int, fmt: str,
                 endpoint_silence_s: float | None = None,
                 hotwords: Hotwords | None = None) -> None:
        self.engine = engine
        self.events = asyncio.Queue()
        self.is_finished = False
        self._loop = asyncio.get_running_loop()
        self.stream_id = engine.open_stream(sample_rate, fmt, self._sink,
                                            endpoint_silence_s=endpoint_silence_s,
                                            hotwords=hotwords)

    def _sink(self, event: StreamEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def next_event(self) -> StreamEvent:
        """The stream's next event.

        Raises:
            Exception: the error `fail` handed over (the stream is aborted).
        """
        event = await self.events.get()
        if isinstance(event, Exception):
            raise event
        if event.is_terminal:
            self.is_finished = True
        return event

    def feed(self, data: bytes) -> bool:
        """Queue PCM in the stream's format; False when the engine already ended the stream.

        Raises:
            ValueError: malformed audio (a message fit for the client).
        """
        try:
            self.engine.feed_audio(self.stream_id, data)
        except KeyError:
            return False
        return True

    def end(self) -> None:
        self.engine.end_stream(self.stream_id)

    def close(self) -> None:
        """Abort the stream unless the engine has already finished it."""
        if not self.is_finished:
            self.engine.abort_stream(self.stream_id)
            self.is_finished = True

    def fail(self, error: Exception) -> None:
        """Abort the stream and raise ``error`` to whoever awaits its next event (the audio
        turned out bad further into a file)."""
        self.close()
        self.events.put_nowait(error)

    def decoded_seconds(self) -> float:
        """Seconds of this stream's audio the engine has decoded (0 while it waits)."""
        entry = self.engine.stats().streams.entry(self.stream_id)
        return 0.0 if entry is None else entry.decoded_s


async def feed_blocks(stream: EngineStream, read_block: Callable[[], np.ndarray],
                      sample_rate: int, max_ahead_s: float) -> None:
    """Feed float32 blocks from ``read_block`` (called on a worker thread, with the feed: a
    decode or a resample never holds the event loop; empty at the end), never more than
    ``max_ahead_s`` ahead of decoding (the engine refuses a stream with too much undecoded
    audio), then end the stream. Returns early once the stream is finished.

    Raises:
        Exception: what ``read_block`` raised, or ValueError for audio the engine refuses;
            the stream is left to the caller (``close`` aborts it).
    """
    fed_s = 0.0

    def next_block() -> float:
        """Read and feed one block on this worker thread; its seconds (0: the end)."""
        block = read_block()
        if block.size and not stream.feed(np.ascontiguousarray(block, dtype="<f4").tobytes()):
            return -1.0  # the engine already ended the stream
        return block.size / sample_rate

    while not stream.is_finished:
        while fed_s - stream.decoded_seconds() > max_ahead_s and not stream.is_finished:
            await asyncio.sleep(PACE_POLL_S)
        if stream.is_finished:
            return
        seconds = await asyncio.to_thread(next_block)
        if seconds <= 0:
            break
        fed_s += seconds
    if not stream.is_finished:
        stream.end()


def is_busy(event: StreamEvent) -> TypeGuard[Error]:
    """A ``busy`` refusal: no slot freed in time (the stream's only event)."""
    return isinstance(event, Error) and event.code == BUSY
