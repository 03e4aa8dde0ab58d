"""Each stream's live-text state: what the partial/final policy keeps between chunks.

The engine loop owns a stream's lifecycle and positions (`StreamView`, which its request
satisfies); everything the policy decides with (the open segment's number, its refinement,
its early final decode, the finals waiting for the second pass, the audio kept for them, the
energies pauses are heard in) lives here, in one `LiveStream` per stream, keyed by stream id
in `LivePolicy`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE, FrameEnergy
from oasr.decoding import Endpointer, Hypothesis, StreamStep
from oasr.decoding.context import Hotwords
from oasr.engine.events import Final, StreamEvent
from oasr.engine.live.agreement import NO_WORDS, RefinedPartial, RefineState
from oasr.engine.live.posteriors import Posteriors
from oasr.engine.live.words import NO_LETTERS, CtcLetters, PartialWords

if TYPE_CHECKING:
    from oasr.engine.second_pass.worker import SecondPassDone

# audio a stream may have sent ahead of the wall time since its first audio and still count
# as paced (a live speaker): a client's frames (up to a second each) and network bursts
PACE_MARGIN_S = 2.0


class StreamView(Protocol):
    """What the policy reads of a stream the loop runs (its request), and how it publishes.

    Positions: ``offset`` counts encoder frames since the last reset (what the model's
    positions see); ``num_frames_decoded`` counts them since the stream began;
    ``segment_start_frame`` is where the open segment began (same count).
    """

    @property
    def stream_id(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def num_frames_decoded(self) -> int: ...

    @property
    def segment_start_frame(self) -> int: ...

    @property
    def num_samples_received(self) -> int: ...

    @property
    def input_ended(self) -> bool: ...

    @property
    def is_running(self) -> bool: ...

    def emit(self, event: StreamEvent) -> None: ...


class SegmentAudio:
    """A stream's recent 16 kHz samples, absolutely indexed, kept for the second pass.

    Invariant: holds at most ``max_samples`` (plus one appended piece); older samples are
    dropped, and a slice reaching before what is held returns None.
    """

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self._pieces: collections.deque[np.ndarray] = collections.deque()
        self.start_sample = 0  # absolute index of the first held sample
        self.num_held = 0

    def append(self, samples: np.ndarray) -> None:
        self._pieces.append(samples)
        self.num_held += len(samples)
        while self._pieces and self.num_held - len(self._pieces[0]) >= self.max_samples:
            self.discard_before(self.start_sample + len(self._pieces[0]))

    def discard_before(self, sample: int) -> None:
        """Drop whole pieces that end at or before absolute index ``sample``."""
        while self._pieces and self.start_sample + len(self._pieces[0]) <= sample:
            dropped = self._pieces.popleft()
            self.start_sample += len(dropped)
            self.num_held -= len(dropped)

    def slice(self, start: int, end: int) -> np.ndarray | None:
        """Samples [start, end) (clipped to what was received); None if start was dropped."""
        if start < self.start_sample or not self._pieces:
            return None
        joined = np.concatenate(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
        return joined[start - self.start_sample : max(start, end) - self.start_sample]


@dataclass(frozen=True)
class SpokenContext:
    """A stream's last published final: what the next segment's second pass may carry as
    context (its audio from ``start_frame`` and its ``text``, forced as the transcript so far)."""

    segment: int
    start_frame: int
    text: str


@dataclass
class EarlyFinal:
    """A segment's final decode started before its endpoint, at a pause: it becomes the
    final's job when the segment ends with the speaker still silent since (``still_holds``)
    and the same committed words (``prefix``: the final must begin with every word committed
    since); ``done`` is its answer once it came. ``tokens``: the CTC hypothesis it started
    on."""

    job_id: int
    tokens: tuple[int, ...]
    prefix: tuple[int, ...] = ()
    done: SecondPassDone | None = None
    num_frames: int = 0  # segment-relative encoder frames its words may reach
    heard_to: int = 0  # segment-relative encoder frames of audio it was given
    # segment-relative: the audio from num_frames to here was heard quiet (a pause heard
    # between chunks, `HeardPause`, less `finals.LATE_TOKEN_GUARD_S`; it grows while the
    # pause goes on); 0 when not heard
    quiet_to: int = 0

    def still_holds(self, hyp: Hypothesis | None) -> bool:
        """Whether the CTC pass heard nothing after the audio this decode has: the same
        tokens, or (the pass's beam re-ranked, or its last chunk was flushed) no token at or
        after ``num_frames``, or after ``quiet_to`` when the audio heard the pause: a token in
        that quiet audio, which the decode was given, is the CTC pass's late emission of the
        last word (a streaming CTC model writes a word's last letters up to a few frames after
        its sound ends), not a new word. Whisper decodes the audio, so a new ranking of the
        same audio changes nothing it was given."""
        tokens = tuple(hyp.tokens) if hyp is not None else ()
        if tokens == self.tokens:
            return True
        return (hyp is not None and bool(hyp.timestamps)
                and hyp.timestamps[-1] < max(self.num_frames, self.quiet_to))


@dataclass(frozen=True)
class HeardPause:
    """A pause heard between chunks (`SegmentCuts.in_quiet`), in absolute encoder frames.

    Attributes:
        frames: the pause so far, after its word's end.
        spoken_to: the end of the audio that holds the segment's words: a CTC token from
            here on means the speaker went on (``EarlyFinal.still_holds``).
        audio_end: the end of the audio heard so far (all of it quiet after ``spoken_to``):
            what an early final decode is given, so a word's soft ending is not cut off.
        went_on: speech followed the quiet audio (`QuietRun.went_on`): the pause is over.
    """

    frames: int
    spoken_to: int
    audio_end: int
    went_on: bool = False

    @property
    def speech_end(self) -> int:
        """Where the pause began: the end of the last word's sound (or its last token)."""
        return self.audio_end - self.frames


@dataclass
class PendingFinal:
    """A segment's final waiting for its second pass (``answered`` once it has replied).

    A final keyed by an early decode that started before words were committed (``prefix``
    set: their Whisper tokens) takes that decode's answer only when it begins with them; the
    segment's own job with them forced (``retry``, its job id) is decoded beside it, and
    whichever usable answer comes first is the final.
    """

    event: Final
    start_frame: int = 0  # where the segment's audio begins (encoder frames)
    answered: bool = False
    text: str | None = None  # the second pass's text; "" = no speech; None = keep the CTC text
    source: str = "whisper"  # whose text ``text`` is: "whisper" or "combined"
    prefix: tuple[int, ...] | None = None
    retry: int | None = None
    # the CTC pass's letters of the segment and the final's (first, end) frames: the times of
    # the words of the text it is published with (`live.words.timed_words`)
    letters: CtcLetters = NO_LETTERS
    span: tuple[int, int] = (0, 0)
    word_probs: tuple[float, ...] = ()  # Whisper's, per word of ``text`` (empty: none)


@dataclass
class LiveStream:
    """One stream's live-text state (engine thread only), beside the loop's view of it.

    ``view`` is the loop's record of the stream: the positions here (``offset``,
    ``num_frames_decoded``, ``segment_start_frame``, ...) read through it and are never
    written by the policy. Segments are numbered here: ``segment`` is the open one's number,
    advanced when its final is published or queued.
    """

    view: StreamView
    audio: SegmentAudio = field(default_factory=lambda: SegmentAudio(0))
    energy: FrameEnergy = field(default_factory=lambda: FrameEnergy(320))  # per encoder frame
    endpointer: Endpointer | None = None  # this stream's own endpoint rules; None: the engine's
    refine: RefineState | None = None  # refined partials of the open segment (second pass on)
    segment: int = 0
    num_segments_emitted: int = 0
    last_partial: str = ""  # the CTC text of the open segment
    last_parts: RefinedPartial = NO_WORDS  # the partial last published in this segment
    ctc_starts: list[int] = field(default_factory=list)  # frame each word of last_partial starts
    pending_finals: dict[int, PendingFinal] = field(default_factory=dict)  # job id -> final
    last_final: SpokenContext | None = None  # the last final published (its text, its audio)
    early: EarlyFinal | None = None  # the open segment's final decode, started at a pause
    # an early decode whose answer ended the open segment's sentence, dropped for CTC tokens
    # after its audio: a later one that answers the same over a sentence's pause more audio
    # says they were no words (applause, a cough) (`FinalPublisher.end_before_noise`)
    sentence_heard: EarlyFinal | None = None
    # absolute encoder frame up to which the last final's decode heard the audio after its
    # words quiet (an early decode on a pause heard between chunks), 0 when none did: the
    # open segment's CTC tokens before it are that final's last word's late letters
    # (`FinalPublisher.publish`)
    heard_quiet_to: int = 0
    # the open segment's last decoded chunk (its hypothesis and endpointing inputs) and the
    # energy frames held when the quiet after it was last counted (`SegmentCuts.in_quiet`)
    last_step: StreamStep | None = None
    quiet_checked_at: int = 0
    num_pause_frames: int = 0  # the pause after the open segment's last word, last measured
    first_audio_at: float | None = None  # monotonic time its first audio arrived
    hotwords: Hotwords | None = None  # its terms and prompt, for its second-pass jobs
    # the open segment's CTC hypothesis after its last chunk, and its frames' posteriors:
    # the times and confidence of the words of its partials and finals (`live.words`)
    ctc_hyp: Hypothesis | None = None
    posteriors: Posteriors = field(default_factory=Posteriors)
    partial_words: PartialWords | None = None  # what its last partial's words came from

    @property
    def prompt(self) -> str:
        """Whisper's previous-text prompt for its jobs ("" for none)."""
        return self.hotwords.whisper_prompt() if self.hotwords is not None else ""

    @property
    def hotword_phrases(self) -> tuple[str, ...]:
        return self.hotwords.phrases if self.hotwords is not None else ()

    def is_paced(self, now: float) -> bool:
        """Whether the stream sends at real-time pace, as a live speaker does: the audio
        received so far is at most `PACE_MARGIN_S` ahead of the wall time since its first
        audio (a file streamed at full speed, or an upload, runs far ahead)."""
        if self.first_audio_at is None:
            return True
        ahead_s = self.num_samples_received / MODEL_SAMPLE_RATE - (now - self.first_audio_at)
        return ahead_s <= PACE_MARGIN_S

    # -- the loop's positions, read-only here ---------------------------------------------
    @property
    def stream_id(self) -> int:
        return self.view.stream_id

    @property
    def offset(self) -> int:
        return self.view.offset

    @property
    def num_frames_decoded(self) -> int:
        return self.view.num_frames_decoded

    @property
    def segment_start_frame(self) -> int:
        return self.view.segment_start_frame

    @property
    def segment_frames(self) -> int:
        """Encoder frames decoded in the open segment."""
        return self.view.num_frames_decoded - self.view.segment_start_frame

    @property
    def num_samples_received(self) -> int:
        return self.view.num_samples_received

    @property
    def input_ended(self) -> bool:
        return self.view.input_ended

    @property
    def is_running(self) -> bool:
        return self.view.is_running

    def emit(self, event: StreamEvent) -> None:
        self.view.emit(event)
