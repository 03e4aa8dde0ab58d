"""One live stream as the engine loop sees it: lifecycle, audio in, features, positions.

What the live-text policy keeps of a stream (its segments' partials and finals, refinements,
pauses) is not here: it lives in `oasr.engine.live`, keyed by stream id.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from oasr.audio import ChunkWindower, FeatureSource
from oasr.decoding.context import Hotwords
from oasr.engine.events import FinishReason, StreamEvent

EventSink = Callable[[StreamEvent], None]


class RequestStatus(enum.Enum):
    """WAITING -> RUNNING -> FINISHED; WAITING -> FINISHED (busy, abort, timeout)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ALLOWED = {
    RequestStatus.WAITING: {RequestStatus.RUNNING, RequestStatus.FINISHED},
    RequestStatus.RUNNING: {RequestStatus.FINISHED},
    RequestStatus.FINISHED: set(),
}


@dataclass
class Request:
    """The engine thread's record of one stream.

    Positions: ``offset`` counts encoder frames since the last reset (what the model's
    positions and caches see); ``num_frames_decoded`` counts them since the stream began (what
    segment times are measured in). ``features`` is the model family's extractor (fbank or
    causal log-mel); ``windower`` cuts its frames into encoder windows and drops the frames no
    window needs any more.
    """

    stream_id: int
    sink: EventSink
    created_at: float
    features: FeatureSource
    windower: ChunkWindower
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    admitted_at: float = 0.0
    last_audio_at: float = 0.0
    last_decoded_at: float = 0.0  # the last chunk decoded: a stream with a backlog is not idle
    pending_audio: list[np.ndarray] = field(default_factory=list)
    num_samples_received: int = 0
    input_ended: bool = False
    offset: int = 0
    num_frames_decoded: int = 0
    segment_start_frame: int = 0
    finish_reason: FinishReason | None = None
    finish_message: str = ""  # why it finished, when the client needs telling (timeouts)
    # the audio-rate window (Scheduler): when it began and the samples received by then
    rate_window_start: float | None = None
    rate_window_samples: int = 0
    hotwords: Hotwords | None = None  # its terms and prompt (replaced by SetHotwords)
    # suspended (its client away, `SuspendStream`): the monotonic time it ends "abandoned"
    suspended_until: float | None = None
    # when the scheduler first saw a window of it ready and not yet run (the batching hold)
    ready_since: float | None = None

    def transition(self, new: RequestStatus) -> None:
        """Move to ``new``; an illegal move is a bug in the engine, so it raises."""
        if new not in _ALLOWED[self.status]:
            raise RuntimeError(
                f"stream {self.stream_id}: illegal transition {self.status.value} -> {new.value}"
            )
        self.status = new

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_running(self) -> bool:
        return self.status is RequestStatus.RUNNING

    @property
    def is_suspended(self) -> bool:
        return self.suspended_until is not None

    @property
    def segment_frames(self) -> int:
        """Encoder frames decoded in the open segment."""
        return self.num_frames_decoded - self.segment_start_frame

    def take_pending_audio(self) -> np.ndarray | None:
        """All audio received since the last call, joined; None when there is none."""
        if not self.pending_audio:
            return None
        audio = self.pending_audio[0] if len(self.pending_audio) == 1 else np.concatenate(
            self.pending_audio)
        self.pending_audio.clear()
        return audio

    @property
    def num_pending_samples(self) -> int:
        return sum(len(a) for a in self.pending_audio)

    def emit(self, event: StreamEvent) -> None:
        self.sink(event)
