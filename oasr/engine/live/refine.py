"""Refined partials: while a segment is open, Whisper re-decodes its audio so far, and the
words consecutive refinements agree on, sure of them, become a committed prefix that never
changes.

A partial then has three parts (``RefinedPartial``): the **stable** words (committed: every
later partial and the segment's final begin with them), the newest refinement's **tentative**
words after them, and the **ctc** words the streaming pass heard after the audio the newest
refinement saw (CTC token times say where that is). Without refinements a partial is all
``ctc``.

The agreement rule is LocalAgreement-n (whisper_streaming's is n = 2, the default) with a
confidence floor: a word is committed once ``RefineConfig.agreeing`` consecutive refinements
all put it at the same place after the committed prefix, compared as they are scored
(``oasr.text.wer.normalize_transcript`` per word, so "man." and "man" agree), and each of them
generated every token of it with at least ``min_word_prob`` (0.8); a phrase a refinement says
twice back to back (`first_repeat`: Whisper's copy of the phrase before it) stays tentative,
with every word after it, and the older refinement's last word waits for the next one
(``hold_words``: a decode that heard a word only at the end of its audio guesses it).
Refinements are greedy decodes of nearly the same audio, so they agree on their guesses too
("It was the best on times" twice, where the final's beam search hears "best of times"; "He was
not an old-sposed young man" three times over, for "ill-disposed"), and a committed word is
forced into the final. The floor keeps most such guesses tentative: in a run of 8 clients over
read passages, about three in four words committed wrongly by agreement alone had a token below
0.8 (down to 0.07), and four in five of the right ones had none. Commits are a prefix, so one
unsure word keeps the rest of its segment tentative: over read passages at 2 clients 78 words
became stable, none wrong, where agreement alone made 484 stable, 40 wrong. Live, over
synthetic and real read passages at 2 and 8 clients, the finals then had as many word errors as
with refinement off, where agreement alone cost 0.9-2.2 points of WER (docs/benchmarks.md).
Each refinement is decoded with the committed prefix forced as the start of its transcript, so
a refinement can only add to it; the segment's final is decoded the same way.

Refinement only takes spare capacity (``RefineConfig``): it is scheduled by the engine thread
when the engine and the second-pass worker are both below their busy budgets, at most
``max_in_flight`` at a time, the stream whose refined text is oldest first, and it is queued
behind every final. The exception is a stream at a pause (``pause_s`` after a word no
refinement has seen): its segment may end there, so its refinement goes first, whatever the
worker's backlog, and is decoded beside the finals rather than after them. At many streams
the engine is busy and partials are the CTC text, as they are with the second pass off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from oasr.engine.live.agreement import (
    LocalAgreement,
    RefinedPartial,
    RefineState,
    compose,
    word_start_frames,
)
from oasr.engine.live.state import LiveStream
from oasr.engine.second_pass.worker import RefineDone, RefineJob, SecondPassDone

if TYPE_CHECKING:
    from oasr.decoding import Hypothesis


@dataclass(frozen=True)
class RefineConfig:
    """When open segments are re-decoded.

    Attributes:
        interval_s: audio a stream must add to its segment before its next refinement.
        agreeing: refinements in a row that must agree on a word to commit it
            (`LocalAgreement`; 2 is whisper_streaming's rule).
        hold_words: an agreed word among the last this many words of the oldest agreeing
            refinement waits for the next one (0: none). 1 keeps a segment's first word from
            being committed by a refinement that heard only it ("Wake." agreed on with the
            next, "Wake out in 42", for "We counted 42"): with
            ``EngineConfig.sentence_end_s`` 0.5, whose segments begin with more silence, the
            devset's finals lost 0-1 words of 144 instead of 3 (docs/benchmarks.md); with
            the sentence rule off it moved nothing.
        min_word_prob: a word is committed only where every agreeing refinement generated
            each of its tokens with at least this probability (greedy decodes agree on their
            guesses too); 0 trusts agreement alone. At 0.8 the finals are as accurate as with
            refinement off; at 8 clients the longest segments' finals come later (they decode
            the words a looser rule would have forced), docs/benchmarks.md.
        ctc_lag_s: a CTC word shown after the refined words must start this long after the
            refined audio ends: a CTC pass emits a word's first letter a little after the
            word begins, so a word Whisper already wrote at the end of the refined audio
            would otherwise show twice ("... for your country. country").
        pause_s: a pause this long after the newest CTC word, which no refinement has seen
            yet, makes the stream due at once, ahead of the streams due by ``interval_s``:
            the segment may end at this pause, and its last partial is then Whisper's
            words, not the CTC pass's.
        min_audio_s: a segment is refined once it holds this much audio.
        agree_gap_s: two consecutive refinements commit the words they agree on only when
            the newer one heard this much more audio; decodes of nearly the same audio
            (an early final decode and the refinement at the same pause) agree on their
            mistakes too, and a committed word is forced into the final.
        max_streams: with more live streams than this, nothing is refined (the CTC partials
            of a busy server).
        max_in_flight: refinements queued or decoding at once, all streams together.
        engine_budget: no refinement starts while the engine thread was busy for more than
            this share of the last seconds (its partial latency comes first).
        worker_budget: ... or while the second-pass worker was (all its processes' busy
            time together, ``EngineConfig.second_pass_processes``: more processes decode
            finals sooner, not more refinements, whose commits the finals must keep).
    """

    interval_s: float = 1.0
    agreeing: int = 2
    hold_words: int = 1
    min_word_prob: float = 0.8
    ctc_lag_s: float = 0.16
    pause_s: float = 0.3
    min_audio_s: float = 1.0
    agree_gap_s: float = 0.5
    max_streams: int = 8
    max_in_flight: int = 2
    engine_budget: float = 0.6
    worker_budget: float = 0.7

    def __post_init__(self) -> None:
        for name in ("interval_s", "pause_s", "min_audio_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RefineConfig.{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("ctc_lag_s", "agree_gap_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RefineConfig.{name} must be >= 0 seconds, got "
                                 f"{getattr(self, name)}")
        if self.agreeing < 2 or self.hold_words < 0:
            raise ValueError(f"RefineConfig needs agreeing >= 2 and hold_words >= 0, got "
                             f"{self.agreeing} and {self.hold_words}")
        if not 0.0 <= self.min_word_prob < 1.0:
            raise ValueError(f"RefineConfig.min_word_prob must be in [0, 1), got {self.min_word_prob}")
        for name in ("max_streams", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"RefineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("engine_budget", "worker_budget"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"RefineConfig.{name} must be in (0, 1], got {getattr(self, name)}")


# the longest phrase (in words) looked for when a refinement repeats itself back to back


class Refiner:
    """Schedules refinements of open segments and applies their results (engine thread only).

    Args:
        config: when to refine.
        worker: the second pass (``SecondPassWorker``): ``try_submit_refine``, ``backlog``,
            ``busy_seconds``.
        timing: the model family's frame timing (encoder frame <-> samples).
        tokenizer: the CTC model's tokenizer (word starts from token times; one without
            ``raw_text`` gives no CTC tail).
        next_job_id: the engine's job-id counter (shared with finals).
    """

    def __init__(self, config: RefineConfig, worker: Any, timing: Any, tokenizer: Any,
                 next_job_id: Callable[[], int],
                 context_of: Callable[[LiveStream, int], tuple[str, np.ndarray]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        # the previous segment's final text and audio for a stream, with this many live
        # (`FinalPublisher.known_context`); None: refinements decode the segment alone
        self.context_of = context_of
        self.worker = worker
        self.timing = timing
        self.tokenizer = tokenizer if hasattr(tokenizer, "raw_text") else None
        self.next_job_id = next_job_id
        shift = timing.frame_shift_s
        self._lag_frames = round(config.ctc_lag_s / shift)  # see RefineConfig.ctc_lag_s
        self._pause_frames = round(config.pause_s / shift)
        self._agree_frames = round(config.agree_gap_s / shift)
        self.num_refined_streams = 0  # streams that got a refinement in the last schedule
        self.avg_interval_s = 0.0  # seconds between a stream's refinements (moving average)
        self._busy_mark = (clock(), 0.0, 0.0)  # (time, engine busy s, worker busy s)
        self._busy_share = (0.0, 0.0)

    def new_state(self) -> RefineState:
        """A stream's refinement state, committing by this refiner's agreement rule."""
        return RefineState(agreement=LocalAgreement(agreeing=self.config.agreeing,
                                                    hold_words=self.config.hold_words))

    def compose(self, stream: LiveStream, hypothesis: Hypothesis | None) -> RefinedPartial:
        """The partial of ``stream`` after a chunk: its CTC text is ``last_partial`` and
        ``hypothesis`` gives the words' times."""
        starts: list[int] = []
        if hypothesis is not None and self.tokenizer is not None:
            starts = word_start_frames(self.tokenizer, hypothesis.tokens, hypothesis.timestamps)
        if hypothesis is not None and hypothesis.timestamps and stream.refine is not None:
            stream.refine.last_token_frame = hypothesis.timestamps[-1] + 1
        stream.ctc_starts = starts
        return self.parts(stream)

    def parts(self, stream: LiveStream) -> RefinedPartial:
        """The partial of ``stream`` from its refinement and its latest CTC words."""
        return compose(stream.refine, stream.last_partial, stream.ctc_starts,
                       self._lag_frames)

    def schedule(self, streams: Sequence[LiveStream], now: float, engine_busy_s: float) -> None:
        """Submit refinements for the streams due (``streams``: every live one), those at a
        pause first, then the oldest refined, within the budgets."""
        live = [r for r in streams if r.is_running and r.refine is not None]
        if not live or len(live) > self.config.max_streams:
            return
        engine_share, worker_share = self._shares(now, engine_busy_s)
        if engine_share > self.config.engine_budget:
            return
        # a busy second pass still takes the refinements at a pause (the last partial a
        # reader sees before the final), ahead of the background ones
        busy = bool(self.worker.backlog) or worker_share > self.config.worker_budget
        shift = self.timing.frame_shift_s
        due = []
        for stream in live:
            state = stream.refine
            assert state is not None
            frames = stream.segment_frames
            if (state.in_flight is not None or not stream.last_partial
                    or stream.early is not None  # its answer refines the partial
                    or frames * shift < self.config.min_audio_s):
                continue
            at_pause = (state.requested_frames < state.last_token_frame
                        and frames - state.last_token_frame >= self._pause_frames)
            if at_pause or (not busy and (frames - state.requested_frames) * shift
                            >= self.config.interval_s):
                due.append((not at_pause, state.refined_at, stream, frames))
        for later, _, stream, frames in sorted(due, key=lambda d: d[:2]):
            if not self._submit(stream, frames, now, at_pause=not later,
                                num_streams=len(streams)):
                return

    def _submit(self, stream: LiveStream, frames: int, now: float, at_pause: bool = False,
                num_streams: int = 1) -> bool:
        per_frame = self.timing.samples_per_frame
        start = stream.segment_start_frame * per_frame
        audio = stream.audio.slice(start, start + frames * per_frame)
        if audio is None or not audio.size:
            return True
        state = stream.refine
        assert state is not None
        context, context_audio = ("", audio[:0]) if self.context_of is None else (
            self.context_of(stream, num_streams))
        job = RefineJob(self.next_job_id(), stream.stream_id, stream.segment,
                        np.concatenate([context_audio, audio]), state.prefix_tokens, frames,
                        at_pause, context=context, context_samples=len(context_audio),
                        draft=state.draft_tokens, ctc_text=stream.last_partial,
                        prompt=stream.prompt, hotwords=stream.hotword_phrases)
        if not self.worker.try_submit_refine(job, self.config.max_in_flight):
            return False
        if state.refined_at:
            self.avg_interval_s += (now - state.refined_at - self.avg_interval_s) * 0.2
        state.in_flight, state.requested_frames, state.refined_at = job.job_id, frames, now
        return True

    def apply(self, stream: LiveStream, done: RefineDone) -> bool:
        """A refinement's result; True when the stream's partial should be republished."""
        state = stream.refine
        if state is None or state.in_flight != done.job_id or done.segment != stream.segment:
            return False  # stale: the segment ended (its final is decoded on its own)
        state.in_flight = None
        if done.failed or done.num_frames < state.refined_frames:
            return False  # an early final decode has seen more audio since
        if not self._take(state, done.text, done.tokens, done.word_ends, done.num_frames,
                          done.word_probs, may_commit=not done.alone):
            return False
        state.num_refinements += 1
        return True

    def apply_early(self, stream: LiveStream, done: SecondPassDone, num_frames: int) -> bool:
        """An early final decode's answer (``FinalPublisher.start_early``: the segment's audio
        up to ``num_frames`` at a pause, beam search on the whole window), taken as a
        refinement until the segment ends: the best text of the segment there is before its
        final. True when the partial should be republished."""
        state = stream.refine
        if state is None or not done.text or num_frames < state.refined_frames:
            return False
        return self._take(state, done.text, done.tokens, done.word_ends, num_frames)

    def _take(self, state: RefineState, text: str, tokens: tuple[int, ...],
              word_ends: tuple[int, ...], num_frames: int,
              word_probs: tuple[float, ...] = (), may_commit: bool = True) -> bool:
        words = text.split()
        # two decodes of nearly the same audio are no second opinion (an early final decode
        # and the refinement at its pause share their mistakes): they do not commit
        commit = may_commit and num_frames - state.refined_frames >= self._agree_frames
        floor = self.config.min_word_prob
        sure = [p >= floor for p in word_probs] if word_probs and floor > 0 else None
        before = len(state.agreement.committed)
        if (not words or len(word_ends) != len(words)
                or not state.agreement.update(words, commit, sure)):
            return False
        state.refined_frames = num_frames
        committed = len(state.agreement.committed)
        if committed > before:
            # only the newly committed words' tokens come from this decode: one not forced
            # with the committed words (it started before they were) agrees with them as
            # compared (case and punctuation aside) but may spell them otherwise ("Call" for
            # the "call" shown), and the final must begin with them as they were shown
            start = word_ends[before - 1] if before else 0
            state.prefix_tokens += tokens[start: word_ends[committed - 1]]
        state.draft_tokens = tokens[word_ends[committed - 1] if committed else 0:]
        return True

    def _shares(self, now: float, engine_busy_s: float) -> tuple[float, float]:
        """Busy shares of the engine and the worker since the last mark (kept >= 1 s apart)."""
        then, engine_then, worker_then = self._busy_mark
        if now - then >= 1.0:
            worker_busy = float(self.worker.busy_seconds)
            self._busy_share = ((engine_busy_s - engine_then) / (now - then),
                                (worker_busy - worker_then) / (now - then))
            self._busy_mark = (now, engine_busy_s, worker_busy)
        return self._busy_share
