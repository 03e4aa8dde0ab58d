"""One engine stream seen from asyncio: commands out, events in on an asyncio queue.

The OpenAI endpoints use this to drive the same ``EngineThread`` streams that ``/ws/asr``
does: the engine thread calls the sink, which hands each event to the owning event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeGuard

import numpy as np

from oasr.engine import EngineThread
from oasr.engine.events import BUSY, Error, StreamEvent

PACE_POLL_S = 0.05


class EngineStream:
    """An open engine stream owned by one asyncio task.

    Invariant: after ``close`` the stream has ended in the engine (terminal event seen) or was
    aborted; ``close`` is safe to call more than once.
    """

    def __init__(self, engine: EngineThread, sample_rate: int, fmt: str,
                 endpoint_silence_s: float | None = None) -> None:
        self.engine = engine
        self.events: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.is_finished = False
        self._loop = asyncio.get_running_loop()
        self.stream_id = engine.open_stream(sample_rate, fmt, self._sink,
                                            endpoint_silence_s=endpoint_silence_s)

    def _sink(self, event: StreamEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def next_event(self) -> StreamEvent:
        event = await self.events.get()
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

    def decoded_seconds(self) -> float:
        """Seconds of this stream's audio the engine has decoded (0 while it waits)."""
        entry = self.engine.stats().streams.entry(self.stream_id)
        return 0.0 if entry is None else entry.decoded_s


async def feed_paced(stream: EngineStream, samples: np.ndarray, sample_rate: int,
                     max_ahead_s: float, piece_s: float = 1.0) -> None:
    """Feed float32 ``samples`` in pieces, never more than ``max_ahead_s`` ahead of decoding
    (the engine refuses a stream with too much undecoded audio), then end the stream."""
    piece = max(1, int(piece_s * sample_rate))
    fed_s = 0.0
    for start in range(0, len(samples), piece):
        while fed_s - stream.decoded_seconds() > max_ahead_s and not stream.is_finished:
            await asyncio.sleep(PACE_POLL_S)
        if stream.is_finished:
            return
        chunk = np.ascontiguousarray(samples[start:start + piece], dtype="<f4")
        try:
            if not stream.feed(chunk.tobytes()):
                return
        except ValueError:  # checked before feeding; if it still happens, free the stream
            stream.close()
            raise
        fed_s += len(chunk) / sample_rate
        await asyncio.sleep(0)
    stream.end()


def is_busy(event: StreamEvent) -> TypeGuard[Error]:
    """A ``busy`` refusal: no slot freed in time (the stream's only event)."""
    return isinstance(event, Error) and event.code == BUSY
