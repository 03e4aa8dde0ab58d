"""Commands other threads send the engine; they take effect between steps: only the engine thread touches the
caches, the model and the decoders."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oasr.decoding.context import Hotwords
from oasr.engine.events import FinishReason
from oasr.engine.request import EventSink
from oasr.engine.second_pass.worker import RefineDone, SecondPassDone


@dataclass(frozen=True)
class OpenStream:
    """A new stream. ``endpoint_silence_s``: seconds of silence after speech that end a
    segment of this stream (endpoint rule 2); None keeps the engine's rules. ``hotwords``:
    terms both passes are biased towards, and the second pass's prompt (None: none)."""

    stream_id: int
    sink: EventSink
    endpoint_silence_s: float | None = None
    hotwords: Hotwords | None = None


@dataclass(frozen=True)
class SetHotwords:
    """Replace a stream's hotwords (and prompt): the next chunk decoded, and every second
    pass job made from then on, use them."""

    stream_id: int
    hotwords: Hotwords


@dataclass(frozen=True)
class AppendAudio:
    stream_id: int
    samples: np.ndarray  # (N,) float32 at 16 kHz


@dataclass(frozen=True)
class EndStream:
    stream_id: int


@dataclass(frozen=True)
class AbortStream:
    stream_id: int


@dataclass(frozen=True)
class SuspendStream:
    """The stream's client went away and may come back (a dropped socket): the stream keeps
    its slot, caches and decoder state, is exempt from the idle and audio-rate timeouts, and
    ends "abandoned" unless resumed within ``window_s`` seconds."""

    stream_id: int
    window_s: float


@dataclass(frozen=True)
class ResumeStream:
    """The suspended stream's client is back: the timeouts apply again from now."""

    stream_id: int


@dataclass(frozen=True)
class FinishAll:
    """End every stream now with ``reason`` (each gets its final and done): a drain's deadline."""

    reason: FinishReason
    message: str = ""


Command = (OpenStream | SetHotwords | AppendAudio | EndStream | AbortStream | SuspendStream
           | ResumeStream | FinishAll | SecondPassDone | RefineDone)
