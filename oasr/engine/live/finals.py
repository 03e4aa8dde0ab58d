"""Segment finals: the CTC text at once, or Whisper's text when the second pass is on.

Finals of one stream are published in segment order: a segment whose second pass finishes
early waits for the segments before it. A stream's ``done`` follows its last final.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.decoding import Hypothesis
from oasr.decoding.words import WordTime, ctc_word_times
from oasr.engine.events import Final
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.state import EarlyFinal, HeardPause, LiveStream, PendingFinal, SpokenContext
from oasr.engine.live.words import ctc_letters, timed_words
from oasr.engine.second_pass.guard import REASONS, SOURCES
from oasr.engine.second_pass.worker import (
    MAX_SEGMENT_S,
    SecondPassDone,
    SecondPassJob,
    SecondPassWorker,
)
from oasr.text.sentences import (
    ends_sentence,
    has_words,
    unfinished_words,
    without_leading_marks,
)

# a demo's load: live streams per second-pass process (`EngineConfig.resolved_light_load_streams`)
LIGHT_LOAD_STREAMS_PER_DECODER = 2
# early final decodes start only while fewer finals than this (per decoding process) wait
# for the second pass: an idle one (a busy one's spare time goes to the finals and
# refinements that are sure)
EARLY_MAX_BACKLOG = 1
# ... and only at a demo's load (`EngineConfig.resolved_light_load_streams`, 2 per decoding
# process): with more streams, the decodes the speakers go on from take the worker's time from
# finals that are sure (bench/live_text.py, 4 clients on one process: final lag p95 3.2 -> 4.0 s
# with them; 1 client: 2.25 -> 1.78 s; 4 clients on two processes: 2.65-2.78 -> 1.97-1.99 s)
# a sentence's end ends its segment early only after this many words (the sentence-pause
# rule's, `EndpointConfig.rule2`): "Yes." alone waits for the endpoint's silence
SENTENCE_MIN_WORDS = 3
# a CTC token this close to the end of the quiet audio an early decode was given may be a new
# word's soft start, not the last word's late letters (`EarlyFinal.still_holds`)
LATE_TOKEN_GUARD_S = 0.1


@dataclass(frozen=True)
class NoiseCut:
    """A segment that ends where its sentence did, the sound after it no words
    (`FinalPublisher.end_before_noise`), in segment-relative encoder frames: ``cut`` where
    the segment ends, ``words_to`` where its final's CTC tokens end."""

    cut: int
    words_to: int


def pause_after_last_token(stream: LiveStream, hyp: Hypothesis | None) -> int:
    """Encoder frames the open segment has decoded after ``hyp``'s last token (0 without
    one): the pause so far, as the decoded chunks tell it."""
    if hyp is None or not hyp.timestamps:
        return 0
    return stream.offset - (hyp.timestamps[-1] + 1)


def _begins_with(done: SecondPassDone, committed: tuple[int, ...]) -> bool:
    """Whether Whisper's answer has text that begins with the committed words' tokens."""
    return done.text is not None and done.tokens[: len(committed)] == committed


def _judged_on_fewer_words(early: EarlyFinal, tokens: tuple[int, ...]) -> bool:
    """Whether the guard rejected the early decode's text against a CTC text that the CTC
    pass has changed since (to ``tokens``: it heard more of the last word, "... seventy fi",
    then "five"): the segment's own decode is then judged against the whole text, not the
    early verdict kept (a number Whisper writes in digits is far from a half-heard spelled
    one)."""
    done = early.done
    return (done is not None and done.text is None and done.rejected is not None
            and tokens != early.tokens)


class FinalPublisher:
    """Turns a finished segment into its final event, through the second pass when it is on.

    Times come from encoder frames through the model family's ``timing`` (40 ms Conformer
    frames, 20 ms Whisper-CTC frames). Counters (for stats): ``num_second_pass`` finals that
    carry the second pass's text (Whisper's, or digits combined with the CTC text),
    ``num_first_pass`` finals that kept the CTC text (second pass off, backlog full, segment
    too long, Whisper raised, or the guard rejected its text), ``num_backlog_full`` segments
    not queued because the backlog was full, ``second_pass_seconds`` summed latency,
    ``num_by_source`` published finals by their ``source`` ("whisper", "ctc", "combined"),
    ``rejected`` published finals whose Whisper text the guard rejected, by reason (an early
    decode the speaker went on from is never counted).
    """

    def __init__(self, worker: SecondPassWorker | None, timing: FrameTiming,
                 tokenizer: Any = None, context_s: float = 0.0, early_s: float = 0.0,
                 light_load_streams: int = LIGHT_LOAD_STREAMS_PER_DECODER,
                 light_context_s: float = 0.0, sentence_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.worker = worker
        self.clock = clock  # a job's submission time
        self.timing = timing
        self.tokenizer = tokenizer  # for the CTC words' times; None: finals carry no words
        self.context_s = context_s  # longest previous segment carried as context (0: none)
        # a pause this long (in frames) after the last token starts the final's decode early
        self.early_frames = round(early_s / timing.frame_shift_s) if early_s > 0 else 0
        self.light_load_streams = light_load_streams  # ... while at most this many are live
        self.light_context_s = light_context_s  # context_s while at most that many are live
        # a pause this long (in frames) ends a segment whose early decode ends a sentence
        self.sentence_frames = round(sentence_s / timing.frame_shift_s) if sentence_s > 0 else 0
        # the end of a heard pause's audio that does not count as quiet (`EarlyFinal.quiet_to`)
        self.late_token_guard = round(LATE_TOKEN_GUARD_S / timing.frame_shift_s)
        self.num_early_used = 0  # finals whose early decode was their final's
        self.num_early_discarded = 0  # early decodes dropped: the speaker went on
        self._job_ids = itertools.count(1)
        self.num_backlog_full = 0
        self.second_pass_seconds = 0.0
        self.num_by_source = dict.fromkeys(SOURCES, 0)
        # finals whose Whisper text the guard rejected, by reason (every key from the start)
        self.rejected = dict.fromkeys(REASONS, 0)

    def publish(self, stream: LiveStream, hyp: Hypothesis, reason: str,
                num_streams: int = 1) -> None:
        """The segment that just ended: publish or queue its final, advance the segment
        (``num_streams`` live streams: whether it carries context, `context_limit_s`).

        With the second pass on, a segment the CTC pass heard nothing in still goes to Whisper
        when its audio is loud enough to hold speech (a weak first pass must not lose it).

        A segment whose CTC tokens all lie in the pause the previous final's decode heard
        quiet (`LiveStream.heard_quiet_to`: an early decode that ended its segment between
        chunks) holds that final's last word's late letters, which the CTC pass wrote after
        the decoded audio the segment was cut at ("them." after "... to do for them."). It
        has no words of its own: it is judged on its audio after that pause, as a segment the
        CTC pass heard nothing in (Whisper hears any word said there), and its final is ""
        otherwise, which takes back the letters' partial.
        """
        late_to, stream.heard_quiet_to = stream.heard_quiet_to, 0
        late = bool(late_to and hyp.timestamps
                    and stream.segment_start_frame + hyp.timestamps[-1] < late_to)
        if late:
            hyp = Hypothesis([], "", hyp.score, [])
        audio = None
        if self.worker is not None:
            audio = self._segment_audio(stream, start_frame=late_to if late else None)
            if audio is not None and not hyp.text and not self.worker.no_speech.has_voice(audio):
                audio = None  # the worker's own voice rule: it would answer "" undecoded
        if audio is None and not hyp.text and not late:
            return
        base = stream.segment_start_frame
        shift = self.timing.frame_shift_s
        first = base + (hyp.timestamps[0] if hyp.timestamps else 0)
        last = base + (hyp.timestamps[-1] + 1 if hyp.timestamps else 0)
        event = Final(stream.stream_id, stream.segment, hyp.text, first * shift,
                      max(last, first) * shift, reason, "ctc", self._words(hyp, base),
                      stream.num_samples_received / MODEL_SAMPLE_RATE)
        span = (first, max(last, first))
        if not hyp.timestamps:  # nothing decoded: the segment's own span
            event = replace(event, start=base * shift, end=stream.num_frames_decoded * shift)
            span = (base, stream.num_frames_decoded)
        letters = ctc_letters(self.tokenizer, hyp, base, stream.posteriors)
        event = replace(event, words=timed_words(hyp.text, letters, span, shift))
        early, stream.early = stream.early, None
        self._forget_sentence(stream)
        if (early is not None and audio is not None
                and not _judged_on_fewer_words(early, tuple(hyp.tokens))
                and self._is_final(early, stream, hyp)):
            self.num_early_used += 1  # decoded at the pause, nothing said since: the final
            stream.segment += 1
            stream.pending_finals[early.job_id] = PendingFinal(event, base, letters=letters,
                                                               span=span)
            stream.heard_quiet_to = base + early.quiet_to if early.quiet_to else 0
            if early.done is not None:
                self.on_second_pass(stream, early.done)
            return
        if (early is not None and audio is not None and self.worker is not None
                and early.done is None and self._holds(early, stream, hyp)):
            # nothing said since, but words were committed while it decoded: its answer is the
            # final if it begins with them (most do); the segment's own decode with them
            # forced goes beside it, for when it does not
            retry = self._job(stream, hyp, audio, num_streams)
            pending = PendingFinal(event, base, prefix=self._committed(stream),
                                   letters=letters, span=span)
            if self.worker.try_submit(retry):
                pending.retry = retry.job_id
            stream.segment += 1
            stream.pending_finals[early.job_id] = pending
            return
        if early is not None:
            self._discard_early(early)
        if audio is not None and self.worker is not None:
            job = self._job(stream, hyp, audio, num_streams)
            if self.worker.try_submit(job):
                stream.segment += 1
                stream.pending_finals[job.job_id] = PendingFinal(event, base, letters=letters,
                                                                 span=span)
                return
            self.num_backlog_full += 1
        if hyp.text or late:  # its CTC text, after the segments before it (some may still decode)
            stream.segment += 1
            stream.pending_finals[self.next_job_id()] = PendingFinal(
                event, base, answered=True, letters=letters, span=span)
            self.flush(stream)

    def start_early(self, stream: LiveStream, hyp: Hypothesis | None, num_streams: int = 1,
                    heard: HeardPause | None = None) -> None:
        """After a chunk that did not end the segment, or between chunks (``heard``: the
        pause `SegmentCuts.in_quiet` heard in the audio after the last chunk): when the
        stream has paused for ``early_s`` after its last word, the second pass is idle and at
        most ``light_load_streams`` streams are live (``num_streams``), start the segment's
        final decode now, so that the final is ready when the endpoint comes; an early decode
        whose words the speaker went on from is dropped (the CTC pass decoded a word after
        them, or the audio holds one: a word's end after its audio, or speech after a pause
        shorter than a sentence's, ``HeardPause.went_on``: the decode cannot end the segment
        there, and the second pass is free a chunk sooner; after a sentence's pause it is
        kept, its answer may still end the segment at that pause; one whose answer ended a
        sentence is kept aside, `_keep_or_discard`), and one whose answer the guard rejected
        against a CTC text the pass has changed since is started again
        (`_judged_on_fewer_words`). While a sentence's end is kept aside, a decode still
        running is left to answer: it tells whether the sound since holds words
        (`end_before_noise`)."""
        if not self.early_frames or self.worker is None:
            return  # off: nothing to start or drop, on every chunk of every stream
        early = stream.early
        tokens = tuple(hyp.tokens) if hyp is not None else ()
        # speech after a pause too short to end the segment at (a sentence's): it is over
        over = heard is not None and heard.went_on and heard.frames < self.sentence_frames
        # the end of the word's sound heard after the decode's audio: a new word; within the
        # late-token guard it is the same word's fade ("daughter-s", -39, -51, -60 dB), which
        # the quiet run measured again from the CTC pass's newer last token
        past = early is not None and heard is not None and (
            heard.speech_end > stream.segment_start_frame + early.heard_to + self.late_token_guard)
        # the speaker went on (the CTC pass or the audio says so), or the decode's verdict is
        # stale (the pass heard the rest of the last word): it is decoded again in this
        # pause, with the whole text as the guard's witness, so that the sentence's end can
        # still end the segment there instead of at the endpoint's silence. One that runs
        # while a sentence's end is kept is left to answer: it tells whether the sound since
        # that end holds words (`end_before_noise`)
        kept = stream.sentence_heard
        testing = (early is not None and early.done is None
                   and kept is not None and kept.done is not None)
        if early is not None and not testing and (
                not early.still_holds(hyp) or over or past
                or (hyp is not None and _judged_on_fewer_words(early, tokens))):
            stream.early = None
            self._keep_or_discard(stream, early)
        if stream.early is not None and heard is not None:
            # the same pause, heard longer and still quiet: a CTC token in it is the last
            # word's late letter too, though the decode was not given that audio
            stream.early.quiet_to = max(stream.early.quiet_to, self._quiet_to(stream, heard))
        pause_frames = heard.frames if heard is not None else pause_after_last_token(stream, hyp)
        if (stream.early is not None or num_streams > self.light_load_streams
                or over
                or hyp is None or not hyp.timestamps
                or pause_frames < self.early_frames
                or self.worker.backlog >= EARLY_MAX_BACKLOG * self.worker.num_decoders):
            return
        audio = self._segment_audio(stream, heard.audio_end if heard is not None else None)
        if audio is None:
            return
        job = self._job(stream, hyp, audio, num_streams)
        spoken_to = heard.spoken_to if heard is not None else stream.num_frames_decoded
        if self.worker.try_submit(job):
            stream.early = EarlyFinal(job.job_id, tokens, job.prefix,
                                       num_frames=spoken_to - stream.segment_start_frame,
                                       heard_to=len(audio) // self.timing.samples_per_frame,
                                       quiet_to=self._quiet_to(stream, heard))

    def _keep_or_discard(self, stream: LiveStream, early: EarlyFinal) -> None:
        """An early decode the speaker went on from, as far as the CTC pass or the audio
        tells: kept as the segment's ``sentence_heard`` when its answer ended a sentence
        (the tokens or the sound after it may be no words: `end_before_noise`), unless an
        older one with the same answer is kept (heard over less of the noise: its end is the
        sentence's); one still decoding is left to answer while another decoder is idle
        (`_on_sentence_heard` then keeps or drops it); else dropped."""
        kept = stream.sentence_heard
        done = early.done
        if done is None:
            idle = self.worker is not None and self.worker.backlog < self.worker.num_decoders
            if self.sentence_frames and kept is None and idle:
                stream.sentence_heard = early
            else:
                self._discard_early(early)
            return
        if (not self._ends_sentence(done, stream)
                or (kept is not None and kept.done is not None and kept.done.text == done.text)):
            self._discard_early(early)
            return
        self._forget_sentence(stream)
        stream.sentence_heard = early

    def _ends_sentence(self, done: SecondPassDone, stream: LiveStream) -> bool:
        """Whether an early decode's answer ends the open segment's sentence."""
        return (bool(self.sentence_frames) and done.text is not None
                and ends_sentence(done.text, self._min_words(stream)))

    def _on_sentence_heard(self, stream: LiveStream, done: SecondPassDone) -> None:
        """The answer of the early decode kept while it ran (`_keep_or_discard`): it stays
        the segment's sentence end when it ends a sentence; else it is dropped."""
        kept = stream.sentence_heard
        assert kept is not None and kept.job_id == done.job_id
        kept.done = done
        if not self._ends_sentence(done, stream):
            self._forget_sentence(stream)

    def _forget_sentence(self, stream: LiveStream) -> None:
        """The segment's kept sentence end is not its final (counted as discarded)."""
        if stream.sentence_heard is not None:
            self._discard_early(stream.sentence_heard)
            stream.sentence_heard = None

    def end_before_noise(self, stream: LiveStream, max_back: int) -> NoiseCut | None:
        """Where to end the open segment, in the past, when its kept sentence end
        (`LiveStream.sentence_heard`) is its final: a later early decode, given ``sentence_s``
        more audio, answered the same text, so the CTC tokens that dropped the first were no
        words Whisper hears (applause, a cough, a door: sound a streaming CTC model writes
        letters for; or the last word's late letters); None otherwise (and, when the later
        decode answered other text, the speaker went on: the kept one is dropped). The
        segment ends where the later decode started (a pause after every CTC token before
        it, so Whisper heard them whole), its final the kept decode's answer over the tokens
        before the kept one's audio; the audio after the cut is decoded again as the next
        segment's, so a word the later decode heard only the start of is not lost.
        ``max_back``: the most frames a cut may reach back (what the stream still holds)."""
        kept, early = stream.sentence_heard, stream.early
        if kept is None or kept.done is None or early is None or early.done is None:
            return None
        if early.done.text != kept.done.text:
            if early.done.text is not None:
                self._forget_sentence(stream)
            return None
        if (early.heard_to - kept.heard_to < self.sentence_frames
                or stream.segment_frames - early.num_frames > max_back
                or not self._begins_with_committed(kept, stream)):
            return None
        stream.sentence_heard = None
        stream.early = kept
        self._discard_early(early)
        cut = min(early.num_frames, stream.segment_frames)
        return NoiseCut(cut=cut, words_to=min(kept.num_frames, cut))

    def _quiet_to(self, stream: LiveStream, heard: HeardPause | None) -> int:
        """The segment-relative frame up to which a heard pause's audio counts as quiet
        (`EarlyFinal.quiet_to`): its end less the late-token guard; 0 when none was heard."""
        if heard is None:
            return 0
        return max(0, heard.audio_end - stream.segment_start_frame - self.late_token_guard)

    def at_sentence_end(self, stream: LiveStream, hyp: Hypothesis | None,
                        pause_frames: int) -> bool:
        """Whether the open segment may end now, before its endpoint's silence: the pause
        after its last word has lasted ``sentence_s`` (``pause_frames`` so far), and its early
        decode has answered with text that ends a sentence (`ends_sentence`, at least
        `SENTENCE_MIN_WORDS` words, or what the previous segment left of its sentence:
        `_min_words`) and is the segment's final (`_is_final`: the speaker said
        nothing since). A breath inside a sentence lasts 0.2-0.4 s, a pause between sentences
        0.6-1.2 s; the decode's punctuation tells the two apart where the pause alone cannot."""
        early = stream.early
        if (not self.sentence_frames or early is None or early.done is None
                or hyp is None or pause_frames < self.sentence_frames):
            return False
        text = early.done.text
        return (text is not None and ends_sentence(text, self._min_words(stream))
                and self._is_final(early, stream, hyp))

    @staticmethod
    def _min_words(stream: LiveStream) -> int:
        """`SENTENCE_MIN_WORDS`, less the words of the sentence the previous segment's
        final left unfinished (a segment cut mid-sentence: its next one ends the sentence,
        in as few words as it has left, "... of someone or other | their daughters.")."""
        last = stream.last_final
        if last is None or last.segment != stream.segment - 1:
            return SENTENCE_MIN_WORDS
        return max(1, SENTENCE_MIN_WORDS - unfinished_words(last.text))

    def context_limit_s(self, num_streams: int) -> float:
        """The longest previous segment carried as context while ``num_streams`` are live:
        ``context_s``, or ``light_context_s`` when longer at a demo's load."""
        if num_streams <= self.light_load_streams:
            return max(self.context_s, self.light_context_s)
        return self.context_s

    def release_audio(self, stream: LiveStream, ended_segment_start: int,
                      num_streams: int = 1) -> None:
        """A segment ended: drop the audio no second pass needs any more (all before the new
        segment; with context carried, all before the segment that just ended, or before
        the last final's when that final is the one before it)."""
        keep_from = stream.num_frames_decoded
        if self.context_limit_s(num_streams) > 0:
            keep_from = ended_segment_start
            last = stream.last_final
            if last is not None and last.segment >= stream.segment - 2:
                # the segment that ended may have no words: the text then goes on from the
                # final before it, over both segments' audio (`_emit`)
                keep_from = min(keep_from, last.start_frame)
        stream.audio.discard_before(keep_from * self.timing.samples_per_frame)

    def _is_final(self, early: EarlyFinal, stream: LiveStream, hyp: Hypothesis) -> bool:
        """Whether the early decode is the ending segment's final: the CTC pass heard nothing
        after its audio (``EarlyFinal.still_holds``: a stream's last chunk, flushed at its
        end, may re-rank the same words), and it begins with every word committed since it
        started: they were forced into it, or its own answer begins with them (it refined
        the partial when it came, `Refiner.apply_early`, and the words it agreed on with the
        refinement before it were committed from it)."""
        return self._holds(early, stream, hyp) and self._begins_with_committed(early, stream)

    def _begins_with_committed(self, early: EarlyFinal, stream: LiveStream) -> bool:
        """Whether the early decode begins with every word committed since it started."""
        committed = self._committed(stream)
        if early.prefix == committed:
            return True
        return early.done is not None and _begins_with(early.done, committed)

    @staticmethod
    def _holds(early: EarlyFinal, stream: LiveStream, hyp: Hypothesis) -> bool:
        """Whether the ending segment is what the early decode heard: the CTC pass heard
        nothing after its words (``EarlyFinal.still_holds``), and the segment reaches past
        them (a decode started on a word the CTC pass had not decoded yet is not the final
        of a segment that ends before that word: the word is the next segment's)."""
        return early.num_frames <= stream.segment_frames and early.still_holds(hyp)

    @staticmethod
    def _committed(stream: LiveStream) -> tuple[int, ...]:
        """Whisper tokens of the open segment's committed words (forced in its final)."""
        return stream.refine.prefix_tokens if stream.refine is not None else ()

    def _discard_early(self, early: EarlyFinal) -> None:
        self.num_early_discarded += 1
        if self.worker is not None and early.done is None:
            self.worker.abort(early.job_id)

    def _job(self, stream: LiveStream, hyp: Hypothesis, audio: np.ndarray,
             num_streams: int) -> SecondPassJob:
        """The second-pass job of the open segment: its audio (after the previous segment's,
        when that is carried as context), its CTC text, the refinement's committed words and
        its newest tentative ones (a draft, for a greedy decode under load)."""
        prefix = self._committed(stream)
        draft = stream.refine.draft_tokens if stream.refine is not None else ()
        context, context_job, context_audio = self._context(stream,
                                                            self.context_limit_s(num_streams))
        return SecondPassJob(self.next_job_id(), stream.stream_id, stream.segment,
                             np.concatenate([context_audio, audio]), self.clock(),
                             hyp.text, prefix, context=context,
                             context_samples=len(context_audio), context_job=context_job,
                             draft=draft, paced=stream.is_paced(self.clock()),
                             prompt=stream.prompt, hotwords=stream.hotword_phrases)

    def _words(self, hyp: Hypothesis, base: int) -> tuple[WordTime, ...]:
        if self.tokenizer is None or not hasattr(self.tokenizer, "raw_text"):
            return ()
        return ctc_word_times(self.tokenizer, hyp.tokens, hyp.timestamps, base,
                              self.timing.frame_shift_s)

    def next_job_id(self) -> int:
        """A new second-pass job id (finals and refinements share the sequence)."""
        return next(self._job_ids)

    def on_second_pass(self, stream: LiveStream, done: SecondPassDone) -> None:
        """Whisper's answer for one of the stream's segments; publish what is now in order."""
        pending = stream.pending_finals.get(done.job_id)
        if pending is not None and pending.prefix is not None:
            taken = self._early_or_retry(done, pending)
            if taken is None:
                return
            done = taken
        elif pending is None:
            pending = next((p for p in stream.pending_finals.values()
                            if p.retry == done.job_id), None)
            if pending is not None:  # a retry's answer: the final's
                if pending.prefix is not None:  # before the early decode it raced
                    self.num_early_discarded += 1
                pending.retry = pending.prefix = None
        if pending is None:
            if stream.early is not None and stream.early.job_id == done.job_id:
                stream.early.done = done  # kept for the final, if the segment ends on it
            elif (stream.sentence_heard is not None
                  and stream.sentence_heard.job_id == done.job_id):
                self._on_sentence_heard(stream, done)
            return
        self.second_pass_seconds += done.seconds
        if done.rejected is not None:
            self.rejected[done.rejected] = self.rejected.get(done.rejected, 0) + 1
        pending.text = done.text
        pending.source = done.source
        pending.word_probs = done.word_probs
        pending.answered = True
        self.flush(stream)

    def _early_or_retry(self, done: SecondPassDone,
                        pending: PendingFinal) -> SecondPassDone | None:
        """The answer of an early decode that words were committed past: the final's when it
        begins with them (its retry is then aborted); else None, the retry's answer awaited,
        or without a retry an answer that keeps the CTC text (this one's, when it has no
        text: it failed, was rejected or given up)."""
        prefix, retry = pending.prefix, pending.retry
        assert prefix is not None
        pending.prefix = pending.retry = None
        if _begins_with(done, prefix):
            self.num_early_used += 1
            if retry is not None and self.worker is not None:
                self.worker.abort(retry)
            return done
        self.num_early_discarded += 1
        if retry is not None:
            pending.retry = retry
            return None
        return done if done.text is None else replace(done, text=None, source="ctc")

    def flush(self, stream: LiveStream) -> None:
        """Publish the leading finals whose second pass has answered.

        Whisper's text replaces the CTC text; "" (no speech) empties the final; None (Whisper
        raised, or the guard rejected its text) keeps the CTC text. Every queued segment gets its final, so its number is used.
        """
        while stream.pending_finals:
            job_id, pending = next(iter(stream.pending_finals.items()))
            if not pending.answered:
                return
            del stream.pending_finals[job_id]
            event = pending.event
            if pending.text is not None:
                probs = pending.word_probs if pending.source == "whisper" else ()
                event = replace(event, text=pending.text, source=pending.source,
                                words=timed_words(pending.text, pending.letters, pending.span,
                                                  self.timing.frame_shift_s, probs))
            self._emit(stream, event, pending.start_frame)

    def drop_pending(self, stream: LiveStream) -> None:
        """The stream vanished: forget its queued segments."""
        if stream.early is not None:
            self._discard_early(stream.early)
            stream.early = None
        self._forget_sentence(stream)
        for job_id, pending in stream.pending_finals.items():
            if self.worker is not None and not pending.answered:  # (answered: no job runs)
                self.worker.abort(job_id)
                if pending.retry is not None:
                    self.worker.abort(pending.retry)
        stream.pending_finals.clear()

    def _segment_end(self, stream: LiveStream) -> int:
        """The sample the open segment's audio ends at: its decoded frames plus the encoder's
        right context."""
        return (stream.num_frames_decoded * self.timing.samples_per_frame
                + self.timing.right_context_samples)

    def _segment_audio(self, stream: LiveStream, end_frame: int | None = None,
                       start_frame: int | None = None) -> np.ndarray | None:
        """The current segment's samples (a copy) up to its decoded audio's end, or to
        absolute encoder frame ``end_frame``, from its start or ``start_frame``; None if it
        is too long, not held or empty."""
        first = stream.segment_start_frame if start_frame is None else start_frame
        start = first * self.timing.samples_per_frame
        end = (self._segment_end(stream) if end_frame is None
               else end_frame * self.timing.samples_per_frame)
        if (end - start) / MODEL_SAMPLE_RATE > MAX_SEGMENT_S:
            return None
        audio = stream.audio.slice(start, end)
        return audio.copy() if audio is not None and audio.size else None

    def known_context(self, stream: LiveStream, num_streams: int) -> tuple[str, np.ndarray]:
        """The previous segment's final text and audio, as this segment's final would carry
        them (`_context`), when that text is out already; ("", no audio) otherwise. A
        refinement of the open segment carries them too (`Refiner`), and does not wait."""
        none = ("", np.zeros(0, dtype=np.float32))
        if stream.pending_finals:  # a final still decoding: not out yet (no audio sliced)
            return none
        text, job_id, audio = self._context(stream, self.context_limit_s(num_streams))
        if job_id is not None or not text.strip():
            return none
        return text, audio

    def _context(self, stream: LiveStream, limit_s: float) -> tuple[str, int | None, np.ndarray]:
        """What this segment's second pass carries from the previous segment: its final's
        text (or, while that is still being decoded, its job id: the worker then waits for
        it) and its audio; none unless the previous segment is at most ``limit_s`` long
        and both fit Whisper's window together. The decode then continues the previous text
        instead of starting cold on a few seconds of audio (Whisper's own long-form
        transcription conditions on the previous text the same way)."""
        none = ("", None, np.zeros(0, dtype=np.float32))
        if limit_s <= 0:
            return none
        text, job_id, start_frame = "", None, 0
        if stream.pending_finals:
            job_id, pending = next(reversed(stream.pending_finals.items()))
            if pending.event.segment != stream.segment - 1:
                return none
            start_frame = pending.start_frame
        else:
            last = stream.last_final
            if last is None or last.segment != stream.segment - 1:
                return none
            text, start_frame = last.text, last.start_frame
        per_frame = self.timing.samples_per_frame
        start, end = start_frame * per_frame, stream.segment_start_frame * per_frame
        if (end - start > limit_s * MODEL_SAMPLE_RATE
                or self._segment_end(stream) - start > MAX_SEGMENT_S * MODEL_SAMPLE_RATE):
            return none
        audio = stream.audio.slice(start, end)
        if audio is None or len(audio) != end - start:
            return none
        return text, job_id, audio.astype(np.float32, copy=True)

    @property
    def num_second_pass(self) -> int:
        """Finals with the second pass's text (Whisper's, or a combined digit string)."""
        return sum(n for source, n in self.num_by_source.items() if source != "ctc")

    @property
    def num_first_pass(self) -> int:
        """Finals that kept the CTC text."""
        return self.num_by_source["ctc"]

    def _emit(self, stream: LiveStream, event: Final, start_frame: int) -> None:
        if event.text and not has_words(event.text):
            # punctuation alone is no final: the segment is empty
            event = replace(event, text="", words=())
        elif event.text != (text := without_leading_marks(event.text)):
            # the previous final's closing mark, written at this one's start: it is not sent
            words = list(itertools.dropwhile(lambda w: not has_words(w.word), event.words))
            if words:
                words[0] = replace(words[0], word=without_leading_marks(words[0].word))
            event = replace(event, text=text, words=tuple(words))
        last = stream.last_final
        if event.text:
            stream.last_final = SpokenContext(event.segment, start_frame, event.text)
        elif last is not None and last.segment == event.segment - 1:
            # no words: the text goes on from the final before, over both segments' audio
            stream.last_final = replace(last, segment=event.segment)
        self.num_by_source[event.source] = self.num_by_source.get(event.source, 0) + 1
        stream.num_segments_emitted += 1
        stream.emit(event)
