"""LivePolicy: what a reader sees while a stream is live, behind the hooks the loop calls.

The engine loop owns the mechanism: streams' lifecycles, their positions, the batched encoder
call, the CTC decode, and what ending a segment does to a stream's caches. This object owns
the policy: the partial it publishes after each chunk (CTC words, or refined words in front
of them), where a segment ends (an endpoint rule's cut, a pause heard between chunks, a
sentence's end its early decode heard), and each segment's final (the CTC text, or the second
pass's). Its decisions come back to the loop as `SegmentEnd` values; the loop ends the segment
and hands its hypothesis back (`end_segment`).

Hooks, in the order a stream meets them: `open`, `on_audio`, `after_chunk` /
`between_chunks`, `on_second_pass` / `on_refined` (answers from the second pass),
`end_segment`, `final_at_finish`, `drop` (a stream that vanished), `close` (its ``done``);
`after_step` once per step paces the second pass and schedules refinements.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE, FrameEnergy
from oasr.decoding import EndpointDecision, Endpointer, FrameStats, Hypothesis, StreamStep
from oasr.decoding.context import Hotwords
from oasr.engine.events import Partial
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.agreement import NO_WORDS, RefinedPartial
from oasr.engine.live.finals import FinalPublisher, pause_after_last_token
from oasr.engine.live.refine import Refiner
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.live.state import LiveStream, SegmentAudio, StreamView
from oasr.engine.live.words import PartialWords
from oasr.engine.second_pass.worker import MAX_SEGMENT_S, RefineDone, SecondPassDone

SEGMENT_AUDIO_MARGIN_S = 5.0  # audio kept beyond the second pass's window
ENDPOINT_REASON = "endpoint"  # the final's reason for every segment the policy ends
# the endpoint count of segments ended at a sentence's end (`FinalPublisher.at_sentence_end`)
SENTENCE_END_RULE = "sentence"
# ... a segment ended where its sentence did, the CTC tokens after it no words
# (`FinalPublisher.end_before_noise`)
SENTENCE_BEFORE_NOISE_RULE = "sentence_before_noise"
# the letters a segment's only word needs before its first partial is shown (`is_sure_start`)
FIRST_WORD_MIN_CHARS = 3


def is_sure_start(parts: RefinedPartial) -> bool:
    """Whether a segment's first partial may be shown: refined words, or CTC text of two
    words or more (the first one finished), or one word of `FIRST_WORD_MIN_CHARS` letters or
    more. The first chunk of a segment often ends inside its first word, and the CTC pass's
    guess at it ("a" for "It was ...") would stand on the page for a chunk."""
    if parts.stable or parts.tentative:
        return True
    words = parts.ctc.split()
    return len(words) >= 2 or (
        len(words) == 1 and sum(char.isalnum() for char in words[0]) >= FIRST_WORD_MIN_CHARS)


@dataclass(frozen=True)
class SegmentEnd:
    """The policy's decision that a stream's open segment ends now.

    Attributes:
        rule: what decided it, as counted in the stats (an endpoint rule's name,
            `SENTENCE_END_RULE`, ...).
        cut_frame: the segment keeps this many of its decoded frames (None: all); fewer is a
            cut in the past, and the frames after it are decoded again as the next segment's.
        words_to: the final keeps only the CTC tokens before this segment frame (at most the
            cut; None: all it keeps).
        between_chunks: decided on the audio after the stream's last chunk.
        reason: the final's ``reason``.
    """

    rule: str
    cut_frame: int | None = None
    words_to: int | None = None
    between_chunks: bool = False
    reason: str = ENDPOINT_REASON


@dataclass(frozen=True)
class YieldRule:
    """When the second pass waits for the streaming step (``EngineConfig.second_pass_yield_s``):
    while some live stream has more than ``limit_samples`` of audio received and not decoded
    (a chunk, the encoder's right context and the yield margin), the step is behind real time.
    """

    limit_samples: int
    samples_per_frame: int

    @classmethod
    def of(cls, yield_s: float | None, chunk_size: int, timing: FrameTiming) -> YieldRule | None:
        """The rule for ``chunk_size``-frame chunks; None (never wait) when ``yield_s`` is."""
        if yield_s is None:
            return None
        chunk_s = chunk_size * timing.frame_shift_s
        return cls(round((chunk_s + yield_s) * MODEL_SAMPLE_RATE) + timing.right_context_samples,
                   timing.samples_per_frame)

    def is_behind(self, streams: Iterable[LiveStream], now: float) -> bool:
        """Whether a running paced stream (`LiveStream.is_paced`) has more audio waiting
        than the limit. A stream sending faster than real time always has: its backlog is
        its own (backpressure slows it), not the step falling behind."""
        return any(s.num_samples_received - s.num_frames_decoded * self.samples_per_frame
                   > self.limit_samples and s.is_paced(now)
                   for s in streams if s.is_running)


class LivePolicy:
    """Partials, segment ends and finals of every live stream (engine thread only).

    Invariant: ``streams`` holds a `LiveStream` for every stream from `open` until `close`
    (a finished stream stays while its finals wait for the second pass).

    Args:
        finals: publishes each segment's final (through the second pass when it is on).
        refiner: refines open segments' partials; None: partials are the CTC text.
        cuts: where segments end, and pauses heard between chunks.
        timing: the model family's frame timing.
        chunk_size: encoder frames per chunk.
        yield_rule: when the second pass waits for the streaming step; None: never.
        light_load_streams: segments end between chunks only while at most this many streams
            are live.
    """

    def __init__(self, finals: FinalPublisher, refiner: Refiner | None, cuts: SegmentCuts,
                 timing: FrameTiming, chunk_size: int, yield_rule: YieldRule | None = None,
                 light_load_streams: int = 0) -> None:
        self.finals = finals
        self.refiner = refiner
        self.cuts = cuts
        self.timing = timing
        self.chunk_size = chunk_size
        self.yield_rule = yield_rule
        self.light_load_streams = light_load_streams
        self.streams: dict[int, LiveStream] = {}
        self._audio_samples = int((MAX_SEGMENT_S + SEGMENT_AUDIO_MARGIN_S) * MODEL_SAMPLE_RATE)

    @property
    def retain_feature_frames(self) -> int:
        """Feature frames each stream's windower keeps, so a cut in the past can be decoded
        again."""
        return self.cuts.retain_feature_frames

    # -- a stream's life ------------------------------------------------------------------------
    def open(self, view: StreamView, endpointer: Endpointer | None = None) -> None:
        """A new stream (``endpointer``: its own endpoint rules; None: the engine's)."""
        stream = LiveStream(view, energy=FrameEnergy(self.timing.samples_per_frame),
                            endpointer=endpointer)
        if self.finals.worker is not None:
            stream.audio = SegmentAudio(self._audio_samples)
        if self.refiner is not None:
            stream.refine = self.refiner.new_state()
        self.streams[view.stream_id] = stream

    def on_audio(self, fed: Sequence[tuple[int, np.ndarray]], now: float) -> None:
        """Each (stream, audio) pair: the stream's audio received by ``now`` (16 kHz; the
        engine joins a step's messages and calls this once a step with every stream that
        sent some): its energies, the samples the second pass may need, and the stream's pace
        (`LiveStream.is_paced`)."""
        for stream_id, samples in fed:
            stream = self.streams[stream_id]
            if stream.first_audio_at is None:
                stream.first_audio_at = now
            stream.energy.append(samples)
            if self.finals.worker is not None:
                stream.audio.append(samples)

    def on_posteriors(self, stream_id: int, first_frame: int, ids: np.ndarray,
                      log_probs: np.ndarray) -> None:
        """A decoded chunk's best CTC log-probs per frame (``ids``, ``log_probs`` (T, k)),
        from absolute encoder frame ``first_frame``: its words' confidence."""
        self.streams[stream_id].posteriors.write(first_frame, ids, log_probs)

    def set_hotwords(self, stream_id: int, hotwords: Hotwords) -> None:
        """The stream's hotwords and prompt: the second-pass jobs made from now on carry
        them (Whisper's prompt, and the guard's terms)."""
        self.streams[stream_id].hotwords = hotwords

    def endpointer(self, stream_id: int) -> Endpointer | None:
        """The stream's own endpoint rules (None: the engine's)."""
        return self.streams[stream_id].endpointer

    def has_pending(self, stream_id: int) -> bool:
        """Whether finals of the stream still wait for the second pass."""
        return bool(self.streams[stream_id].pending_finals)

    def segment(self, stream_id: int) -> int:
        """The number of the stream's open segment."""
        return self.streams[stream_id].segment

    def drop(self, stream_id: int) -> None:
        """The stream vanished: its finals waiting for the second pass are not published."""
        self.finals.drop_pending(self.streams[stream_id])

    def close(self, stream_id: int) -> int:
        """The stream is done: forget it; the number of finals it was sent."""
        return self.streams.pop(stream_id).num_segments_emitted

    def shutdown(self) -> None:
        """Stop the second pass (server shutdown)."""
        if self.finals.worker is not None:
            self.finals.worker.stop()

    # -- after the encoder ----------------------------------------------------------------------
    def after_chunk(self, stream_id: int, text: str, hyp: Hypothesis | None,
                    stats: FrameStats | None, endpoint: EndpointDecision | None, is_last: bool,
                    num_streams: int) -> SegmentEnd | None:
        """A chunk of the stream was decoded (the loop has advanced its positions): publish
        its partial, and decide whether its segment ends (an endpoint rule fired, or its
        early decode heard a sentence's end) or its final's decode starts early.

        Args:
            text, hyp, stats, endpoint: the CTC pass's text, best hypothesis, endpointing
                inputs and endpoint decision after this chunk.
            is_last: the stream's last chunk (its final comes with its end).
            num_streams: live streams.
        """
        stream = self.streams[stream_id]
        if self.cuts.quiet is not None and hyp is not None and stats is not None:
            stream.last_step = StreamStep(hyp, stats)
        stream.ctc_hyp = hyp
        if text != stream.last_partial or self.refiner is not None:
            stream.last_partial = text
            if self.refiner is not None:
                parts = self.refiner.compose(stream, hyp)
            else:
                parts = RefinedPartial("", "", text)
            self._emit_partial(stream, parts)
        if endpoint is not None and not is_last:
            return SegmentEnd(endpoint.rule, self.cuts.cut_frame(stream, endpoint))
        self.cuts.forget_old_energy(stream)
        if is_last:
            return None
        stream.num_pause_frames = pause_after_last_token(stream, hyp)
        if hyp is not None:
            end = self._end_at_sentence(stream, hyp)
            if end is not None:
                return end
        self.finals.start_early(stream, hyp, num_streams)
        return None

    def listens_between_chunks(self, num_streams: int) -> bool:
        """Whether pauses are heard between chunks with ``num_streams`` live: only at a
        demo's load (``light_load_streams``); above it segments end at chunks."""
        return self.cuts.quiet is not None and num_streams <= self.light_load_streams

    def between_chunks(self, stream_id: int, num_streams: int) -> SegmentEnd | None:
        """A running stream that got no chunk this step: its segment ends when the audio
        after its last chunk already holds its pause (`SegmentCuts.in_quiet`), or its early
        final starts on that pause."""
        stream = self.streams[stream_id]
        decision, pause = self.cuts.in_quiet(stream)
        if decision is not None:
            return SegmentEnd(decision.rule, decision.cut_frame, between_chunks=True)
        if pause is None or stream.last_step is None:
            return None
        # a pause after a word the CTC pass has not decoded yet starts an early decode; it
        # cannot end the segment (the word is not in it yet)
        after_decoded = pause.speech_end <= stream.num_frames_decoded
        stream.num_pause_frames = pause.frames if after_decoded else 0
        hyp = stream.last_step.hypothesis
        end = self._end_at_sentence(stream, hyp, between_chunks=True)
        if end is None:
            self.finals.start_early(stream, hyp, num_streams, pause)
        return end

    def _end_at_sentence(self, stream: LiveStream, hyp: Hypothesis,
                         between_chunks: bool = False) -> SegmentEnd | None:
        """The open segment ends now if its early decode ends a sentence and the pause after
        it is long enough (`FinalPublisher.at_sentence_end`), or in the past where a sentence
        ended that the sound since holds no words after (`FinalPublisher.end_before_noise`)."""
        noise = self.finals.end_before_noise(
            stream, self.cuts.max_rewind_frames - self.chunk_size)
        if noise is not None:
            return SegmentEnd(SENTENCE_BEFORE_NOISE_RULE, noise.cut, noise.words_to,
                              between_chunks)
        if not self.finals.at_sentence_end(stream, hyp, stream.num_pause_frames):
            return None
        heard = self.cuts.heard_pause(stream, hyp)
        if heard and heard < self.finals.sentence_frames:
            return None  # the audio's measure where it has one: the CTC token's runs long
        return SegmentEnd(SENTENCE_END_RULE, between_chunks=between_chunks)

    # -- answers of the second pass -------------------------------------------------------------
    def on_second_pass(self, done: SecondPassDone) -> SegmentEnd | None:
        """Whisper's answer for one of a stream's decodes (a final's, or an early one's): the
        finals now in order are published, an early decode's text refines the partial, and
        the segment may end at its sentence's end."""
        stream = self.streams.get(done.stream_id)
        if stream is None:
            return None
        self.finals.on_second_pass(stream, done)
        early = stream.early
        if (self.refiner is not None and stream.is_running and early is not None
                and early.done is done
                and self.refiner.apply_early(stream, done, early.num_frames)):
            self._emit_partial(stream, self.refiner.parts(stream))
        if stream.is_running and stream.last_step is not None:
            return self._end_at_sentence(stream, stream.last_step.hypothesis)
        return None

    def on_refined(self, done: RefineDone) -> None:
        """A refinement's answer: the open segment's partial with its words."""
        stream = self.streams.get(done.stream_id)
        if stream is None or self.refiner is None or not stream.is_running:
            return
        if self.refiner.apply(stream, done):
            self._emit_partial(stream, self.refiner.parts(stream))

    # -- segment ends ---------------------------------------------------------------------------
    def end_segment(self, stream_id: int, hyp: Hypothesis, reason: str, cut: int,
                    num_streams: int) -> None:
        """The loop ends the open segment after ``cut`` of its frames (``num_frames_decoded``
        already moved to the cut; ``hyp`` is what the CTC pass heard up to it): its final,
        then the audio and energies no later segment needs are dropped."""
        stream = self.streams[stream_id]
        self.cuts.forget_words_past(stream, cut)
        self._publish_final(stream, hyp, reason, num_streams)
        self.finals.release_audio(stream, stream.segment_start_frame, num_streams)
        self.cuts.forget_old_energy(stream)
        stream.posteriors.drop_before(stream.num_frames_decoded)  # the next segment's start

    def final_at_finish(self, stream_id: int, hyp: Hypothesis, reason: str,
                        num_streams: int) -> None:
        """The stream ended (``reason``: its finish reason): its open segment's final."""
        self._publish_final(self.streams[stream_id], hyp, reason, num_streams)

    def _publish_final(self, stream: LiveStream, hyp: Hypothesis, reason: str,
                       num_streams: int) -> None:
        stream.last_partial = ""
        stream.last_parts = NO_WORDS  # a new segment's partial is sent once it has words
        stream.last_step = None
        stream.ctc_hyp = None
        stream.num_pause_frames = 0
        self.finals.publish(stream, hyp, reason, num_streams)
        if stream.refine is not None:
            stream.refine.reset()

    def _emit_partial(self, stream: LiveStream, parts: RefinedPartial) -> None:
        """Publish the segment's partial when any of its parts changed (so never an empty
        partial at a segment's start, with refinements or without)."""
        parts = parts.from_first_word()
        if parts == stream.last_parts:
            return
        if stream.last_parts == NO_WORDS and not is_sure_start(parts):
            return  # a segment's first partial waits for words, not a first letter's guess
        stream.last_parts = parts
        if stream.partial_words is None:  # its first partial
            stream.partial_words = PartialWords(self.finals.tokenizer)
        words = stream.partial_words.words(
            parts.text, stream.ctc_hyp, stream.posteriors,
            (stream.segment_start_frame, stream.num_frames_decoded), self.timing.frame_shift_s)
        end = stream.num_frames_decoded * self.timing.frame_shift_s
        behind = stream.num_samples_received - stream.num_frames_decoded * self.timing.samples_per_frame
        stream.emit(Partial(stream.stream_id, stream.segment, parts.text, end,
                            stable=parts.stable, tentative=parts.tentative, ctc=parts.ctc,
                            lag_ms=max(0, behind) * 1000 // MODEL_SAMPLE_RATE, words=words))

    # -- once per step --------------------------------------------------------------------------
    def after_step(self, views: Mapping[int, StreamView], now: float,
                   engine_busy_s: float) -> None:
        """After a step (that began at ``now``; ``views``: the live streams): hold the second
        pass while a live stream is behind real time (partials first), and submit the
        refinements due."""
        worker = self.finals.worker
        if worker is not None and self.yield_rule is not None:
            worker.hold(self.yield_rule.is_behind([self.streams[s] for s in views], now))
        if self.refiner is not None:
            self.refiner.schedule([self.streams[s] for s in views], now, engine_busy_s)

