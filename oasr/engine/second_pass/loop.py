"""The second pass's decoding side: the loop that feeds Whisper's continuous decoder with
queued jobs and turns its results into answers, wherever it runs.

`SecondPassLoop` owns the decoder and everything only the decoding side knows: jobs in the
decoder, finals waiting for the previous segment's text (their context), the recent finals'
texts, and the counters. It takes its commands from a ``get`` function (a job, a job id to
abort, or None to stop) and hands each answer to ``emit``; the engine side
(``oasr.engine.second_pass.worker.SecondPassWorker``) runs it on a thread of the engine's process or
in a process of its own (``oasr.engine.second_pass.process``) and keeps the accounting of
what is outstanding.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from oasr.decoding.words import word_probabilities
from oasr.engine.second_pass.guard import FirstPassGuard, respell_hotwords
from oasr.engine.second_pass.jobs import RefineDone, RefineJob, SecondPassDone, SecondPassJob
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.text.sentences import as_context
from oasr.text.wer import normalize_transcript

logger = logging.getLogger(__name__)

# finals' texts kept for a next segment that may still arrive (its context), and segments
# refined alone, at most this many each
MAX_REMEMBERED_FINALS = 1024

PAUSE_POLL_S = 0.05  # while held back, commands are taken this often
# the most tokens of a stream's prompt (its hotwords) given to Whisper: the last ones are kept
# (Whisper's own long-form transcription keeps up to half its 448 positions of earlier text)
MAX_PROMPT_TOKENS = 120

Command = SecondPassJob | RefineJob | int | None
J = TypeVar("J", SecondPassJob, RefineJob)
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class _Nothing:
    """The answer of a decode that heard nothing (a refinement not decoded after its
    context again: the segment's earlier one heard nothing after it)."""

    tokens: tuple[int, ...] = ()
    text: str = ""
    failed: bool = False


_NOTHING = _Nothing()


def _remember(store: dict[K, V], key: K, value: V) -> None:
    """Put ``key`` in ``store``, forgetting the oldest beyond ``MAX_REMEMBERED_FINALS``."""
    store[key] = value
    while len(store) > MAX_REMEMBERED_FINALS:
        store.pop(next(iter(store)))


class CommandGate:
    """The engine's end of a decoding side, wherever it runs: the command queue and the
    leave to step (a ``queue``/``threading`` pair on a thread, their ``multiprocessing``
    counterparts for a process). Leave is given at the start."""

    num_decoders = 1  # one decoding loop behind one gate

    def __init__(self, commands: Any, may_step: Any) -> None:
        self._commands = commands
        self._may_step = may_step
        may_step.set()

    def put(self, command: Command) -> None:
        self._commands.put(command)

    def hold(self, held: bool) -> None:
        """Withhold (True) or give back (False) the leave to run decoder steps."""
        if held:
            self._may_step.clear()
        else:
            self._may_step.set()


@dataclass
class LoopCounters:
    """What the decoding side counts (read by the engine's stats).

    Attributes:
        num_no_voice: segments answered "" without decoding.
        num_no_speech: segments whose Whisper text was dropped as no speech.
        num_with_context: finals decoded after the previous segment's text.
        num_context_retries: decodes (finals or refinements) redone without the previous
            segment's text, after Whisper ended the transcript right after it.
        num_refinements: refinements decoded.
        num_fallbacks: decodes redone at a higher temperature.
        num_beam_retries: a busy server's greedy finals that failed the fallback rule and
            were beam-searched.
        num_cancelled: finals whose beam search was given up: aborted (an early final the
            speaker went on from) while it was searched or before it began.
        busy_seconds: time spent in decoder steps.
    """

    num_no_voice: int = 0
    num_no_speech: int = 0
    num_with_context: int = 0
    num_context_retries: int = 0
    num_refinements: int = 0
    num_fallbacks: int = 0
    num_beam_retries: int = 0
    num_cancelled: int = 0
    busy_seconds: float = 0.0


class SecondPassLoop:
    """Decodes queued jobs with Whisper's continuous decoder (one thread: the one in `run`).

    Args:
        decoder: ``oasr.models.whisper.continuous.ContinuousWhisperDecoder`` (or a test's
            scripted one): ``submit``, ``step``, ``abort``, ``has_work``, ``text_tokens``,
            ``text_of``, ``word_ends``, ``max_new_tokens``; where it has a ``cancelled``
            attribute, the loop sets it to `is_aborted` (asked during a long step).
        emit: receives each answer (`SecondPassDone` or `RefineDone`), exactly once per job
            not aborted.
        no_speech: when a segment holds no speech.
        guard: reviews Whisper's text against the CTC text (None: always kept).
        fast_backlog: finals that find more than this many finals on this side are decoded
            fast (greedy on the segment's own window); None: never.
    """

    def __init__(self, decoder: object, emit: Callable[[SecondPassDone | RefineDone], None],
                 no_speech: NoSpeechRule | None = None, guard: FirstPassGuard | None = None,
                 fast_backlog: int | None = None) -> None:
        self.decoder = decoder
        self.emit = emit
        self.no_speech = no_speech or NoSpeechRule()
        self.guard = guard
        self.fast_backlog = fast_backlog
        self.counters = LoopCounters()
        # jobs in the decoder, finals waiting for the previous segment's final (keyed by
        # that job's id), recent finals' texts by job id, and finals taken but not started
        self._active: dict[int, SecondPassJob | RefineJob] = {}
        self._deferred: dict[int, SecondPassJob] = {}
        self._final_texts: dict[int, str] = {}
        # jobs decoded again without their context: the job as it was and its first result
        self._before_alone: dict[int, tuple[SecondPassJob | RefineJob, object]] = {}
        # open segments (stream, segment) whose refinement Whisper ended at the context: their
        # next refinements are decoded alone at once (greedy ends there again), oldest first
        self._refined_alone: dict[tuple[int, int], None] = {}
        # finals of streams sending faster than real time (`SecondPassJob.paced` False),
        # handed to the decoder only while no paced stream's final waits for a row
        self._unpaced: deque[SecondPassJob] = deque()
        self._num_taken = self._num_paced_taken = 0
        # commands taken while the decoder stepped (handled after the step, in order), the
        # job ids they abort, and whether they stop the loop
        self._get: Callable[[bool], Command] | None = None
        self._taken_early: deque[Command] = deque()
        self._prompt_tokens: dict[str, tuple[int, ...]] = {}  # streams' prompts, tokenised
        self._aborted: set[int] = set()
        self._stop_taken = False
        if hasattr(decoder, "cancelled"):
            decoder.cancelled = self.is_aborted

    def run(self, get: Callable[[bool], Command],
            may_step: Callable[[float], bool] | None = None) -> None:
        """Decode until a None command; ``get(block)`` returns the next command, or raises
        ``queue.Empty`` when there is none and ``block`` is False. ``may_step(timeout)`` waits
        up to ``timeout`` seconds for leave to run the next decoder step (the engine withholds
        it while its streams are behind); commands are still taken while it is withheld."""
        self._get = get
        while True:
            self._release_unpaced()
            block = not self.decoder.has_work()  # type: ignore[attr-defined]
            if not self._take_commands(get, block):
                return
            if may_step is not None:
                if not may_step(PAUSE_POLL_S):
                    continue
                # what came while it asked (an abort of a final given up) goes in first
                if not self._take_commands(get, False):
                    return
            started = time.perf_counter()
            try:
                finished = self.decoder.step()  # type: ignore[attr-defined]
            except Exception:
                logger.exception("second pass failed; its segments keep their CTC text")
                finished = []
                for job_id in list(self._active):
                    self.decoder.abort(job_id)  # type: ignore[attr-defined]
                    self._drop(self._active.pop(job_id))
            self.counters.busy_seconds += time.perf_counter() - started
            self.counters.num_fallbacks = int(getattr(self.decoder, "num_fallbacks", 0))
            self.counters.num_beam_retries = int(getattr(self.decoder, "num_beam_retries", 0))
            self.counters.num_cancelled = int(getattr(self.decoder, "num_cancelled", 0))
            for result in finished:
                job = self._active.pop(result.request_id, None)
                if job is not None:
                    self._answer(job, result)

    def _answer(self, job: SecondPassJob | RefineJob, result: object) -> None:
        """Turn a finished decode into its job's answer (or decode it again alone)."""
        first = self._before_alone.pop(job.job_id, None)
        if first is None and self._ended_at_context(result, job):
            self._again_without_context(job, result)
            return
        if first is not None and not self._heard_alone(result, job):
            (job, result), first = first, None  # the decode after the context stands
        if isinstance(job, RefineJob):
            self._refined(job, result, alone=first is not None)
        else:
            text, source, rejected, tokens = self._review(result, job)
            self._finish(job, text, source, rejected, tokens,
                         self._word_probs(job, result, tokens))

    @property
    def num_finals(self) -> int:
        """Finals on this side: decoding, waiting for their context, or taken to start."""
        active = sum(isinstance(job, SecondPassJob) for job in self._active.values())
        return active + len(self._deferred) + len(self._unpaced) + self._num_taken

    def _num_paced_finals(self) -> int:
        """Paced streams' finals on this side (decoding or waiting for their context)."""
        jobs = [*self._active.values(), *self._deferred.values()]
        return (sum(isinstance(job, SecondPassJob) and job.paced for job in jobs)
                + self._num_paced_taken)

    def _release_unpaced(self) -> None:
        """Hand the decoder the next final of a faster stream while no final waits for a
        row (a paced stream's final waits behind at most one of them)."""
        while self._unpaced and not getattr(self.decoder, "num_urgent", 0):
            self._start(self._unpaced.popleft(), queue_unpaced=False)

    def is_aborted(self, job_id: int) -> bool:
        """Whether ``job_id`` has been aborted (or the loop stopped) since the commands were
        last handled: asked by the decoder during a long step (before each token of a beam
        search, for each final in it), so that a decode nobody wants any more is given up.
        The commands it takes meanwhile are handled after the step, in the order they
        came."""
        while self._get is not None:
            try:
                command = self._get(False)
            except queue.Empty:
                break
            self._taken_early.append(command)
            if command is None:
                self._stop_taken = True
            elif isinstance(command, int):
                self._aborted.add(command)
        return self._stop_taken or job_id in self._aborted

    def _take_commands(self, get: Callable[[bool], Command], block: bool) -> bool:
        """Move every queued submission and abort into the decoder. False on stop."""
        taken: list[Command] = list(self._taken_early)
        self._taken_early.clear()
        self._aborted.clear()
        self._stop_taken = False
        block = block and not taken
        while True:
            try:
                taken.append(get(block))
            except queue.Empty:
                break
            block = False
        self._num_taken = sum(isinstance(item, SecondPassJob) for item in taken)
        self._num_paced_taken = sum(isinstance(item, SecondPassJob) and item.paced
                                    for item in taken)
        for item in taken:
            if item is None:
                return False
            if isinstance(item, int):
                self._abort(item)
            elif isinstance(item, RefineJob):
                item = self._with_context(item)
                if item.context_tokens and (item.stream_id, item.segment) in self._refined_alone:
                    self._again_without_context(item, None)
                else:
                    self._start_refine(item)
            else:
                self._num_taken -= 1
                self._num_paced_taken -= item.paced
                self._take_final(item)
        return True

    def _take_final(self, job: SecondPassJob) -> None:
        if not self.no_speech.has_voice(job.audio[job.context_samples:]):
            self.counters.num_no_voice += 1
            self._finish(job, "")
            return
        if job.context_job is not None:
            if job.context_job in self._final_texts:  # the previous final is out
                job = replace(job, context=self._final_texts.pop(job.context_job),
                              context_job=None)
            elif job.context_job in self._active or job.context_job in self._deferred:
                self._deferred[job.context_job] = job  # decoded once it is out
                return
            else:  # the previous segment's job was aborted
                job = replace(job, context_job=None)
        self._start(job)

    def _abort(self, job_id: int) -> None:
        self._before_alone.pop(job_id, None)
        self._unpaced = deque(job for job in self._unpaced if job.job_id != job_id)
        job = self._active.pop(job_id, None)
        if job is not None:
            self.decoder.abort(job_id)  # type: ignore[attr-defined]
        for waited_on, deferred in list(self._deferred.items()):
            if deferred.job_id == job_id:
                del self._deferred[waited_on]
        if job_id in self._deferred:  # the next segment goes on without this one's text
            self._start(replace(self._deferred.pop(job_id), context_job=None))

    def _start(self, job: SecondPassJob, queue_unpaced: bool = True) -> None:
        """Hand a final's job to the decoder, with its context's tokens forced first; a
        faster stream's final waits its turn behind the paced streams' (`_release_unpaced`)."""
        if queue_unpaced and not job.paced:
            self._unpaced.append(job)
            self._release_unpaced()
            return
        # under backlog the finals are decoded fast (greedy, the segment's window) so the
        # second pass keeps up and leaves the streaming step its CPU; faster streams' finals
        # waiting their turn do not make a paced stream's final fast
        waiting = self.num_finals if not job.paced else self._num_paced_finals()
        fast = self.fast_backlog is not None and waiting + 1 > self.fast_backlog
        job = self._with_context(job)
        if job.context_tokens:
            self.counters.num_with_context += 1
        self._active[job.job_id] = job
        self.decoder.submit(job.job_id, job.audio,  # type: ignore[attr-defined]
                            prefix=job.context_tokens + job.prefix, fast=fast,
                            draft=job.draft, **self._previous(job))

    def _start_refine(self, job: RefineJob) -> None:
        """Hand a refinement to the decoder (its context's tokens, if any, forced first)."""
        self._active[job.job_id] = job
        # greedy on the segment's window either way; one at a pause goes beside the finals
        # instead of after them
        self.decoder.submit(job.job_id, job.audio,  # type: ignore[attr-defined]
                            prefix=job.context_tokens + job.prefix,
                            background=not job.at_pause, fast=True, draft=job.draft,
                            **self._previous(job))

    def _previous(self, job: SecondPassJob | RefineJob) -> dict[str, tuple[int, ...]]:
        """The ``previous`` argument of a job's decode: its stream's prompt (hotwords) as
        Whisper tokens, at most `MAX_PROMPT_TOKENS` (the last); none without a prompt."""
        if not job.prompt:
            return {}
        tokens = self._prompt_tokens.get(job.prompt)
        if tokens is None:
            tokens = tuple(self.decoder.text_tokens(  # type: ignore[attr-defined]
                " " + job.prompt))[-MAX_PROMPT_TOKENS:]
            _remember(self._prompt_tokens, job.prompt, tokens)
        return {"previous": tokens} if tokens else {}

    def _ended_at_context(self, result: object, job: SecondPassJob | RefineJob) -> bool:
        """Whisper ended the transcript right after the previous segment's text, with none
        of this segment's words forced: it judged the whole window said (tiny.en does so
        after some sentences whatever follows them, a greedy decode more often than a beam
        search), which this segment's own audio, decoded alone, may not bear out."""
        return (bool(job.context_tokens) and not job.prefix
                and len(getattr(result, "tokens", ())) <= len(job.context_tokens))

    def _again_without_context(self, job: SecondPassJob | RefineJob,
                               result: object | None) -> None:
        """Decode the job again on its own audio alone, with no context; ``result`` (the
        decode after the context; None: a refinement of a segment whose earlier one ended at
        the context, not decoded with it again) stands unless the new one is heard
        (`_heard_alone`)."""
        self.counters.num_context_retries += 1
        result = _NOTHING if result is None else result
        alone = replace(job, audio=job.audio[job.context_samples:], context="",
                        context_samples=0, context_tokens=())
        if isinstance(job, RefineJob):
            _remember(self._refined_alone, (job.stream_id, job.segment), None)
            if not self.no_speech.has_voice(alone.audio):
                self._refined(job, result)
                return
        self._before_alone[job.job_id] = (job, result)
        if isinstance(alone, RefineJob):
            self._start_refine(alone)
        else:
            self._start(alone)  # (a final's own audio was found to have a voice when taken)

    def _heard_alone(self, result: object, job: SecondPassJob | RefineJob) -> bool:
        """Whether a decode of a segment's own audio (redone without the context, after
        which Whisper heard nothing) is to be believed: it wrote words, passed its
        safeguards, does not judge itself no speech, and the CTC pass heard about the same
        (the guard's length and distance checks from one CTC word on: what Whisper writes on
        applause alone, "Thank you.", is not what the CTC pass spelled there). With no CTC
        words, or no guard, the two decodes disagree with no witness: the first stands."""
        text = str(getattr(result, "text", "")).strip()
        if (not text or getattr(result, "failed", False) or self.no_speech.is_no_speech(
                getattr(result, "no_speech_prob", None), getattr(result, "avg_log_prob", 0.0),
                prompted=bool(self._previous(job)))):
            return False
        if self.guard is None or not normalize_transcript(job.ctc_text).split():
            return False
        return replace(self.guard, min_words=1).rejection(text, job.ctc_text,
                                                          hotwords=job.hotwords) is None

    def _with_context(self, job: J) -> J:
        """The job (a final's or a refinement's) with its context's tokens; without any
        context (audio and text) when it has no text, or the text would take more than half
        of the decoder's room."""
        tokens: tuple[int, ...] = ()
        if job.context.strip():
            tokens = tuple(self.decoder.text_tokens(  # type: ignore[attr-defined]
                " " + as_context(job.context)))
        room = (int(getattr(self.decoder, "max_new_tokens", 0)) - len(job.prefix)
                - len(self._previous(job).get("previous", ())))
        if not tokens or len(tokens) > room // 2:
            return replace(job, audio=job.audio[job.context_samples:], context="",
                           context_samples=0)  # (a final's context job is resolved by now)
        return replace(job, context_tokens=tokens)

    def _drop(self, job: SecondPassJob | RefineJob) -> None:
        """A job the decoder lost: a final keeps its CTC text, a refinement is forgotten."""
        self._before_alone.pop(job.job_id, None)
        if isinstance(job, RefineJob):
            self._refined(job, None)
        else:
            self._finish(job, None)

    def _refined(self, job: RefineJob, result: object | None, alone: bool = False) -> None:
        if result is None:
            self.emit(RefineDone(job.job_id, job.stream_id, job.segment, "", (), (), True,
                                 job.num_frames))
            return
        self.counters.num_refinements += 1
        text, tokens = self._after_context(result, job)
        ends = self._word_ends(tokens)
        probs = word_probabilities(ends, len(job.prefix), getattr(result, "token_log_probs", ()))
        self.emit(RefineDone(
            job.job_id, job.stream_id, job.segment, text, tokens, ends,
            bool(getattr(result, "failed", False)), job.num_frames, probs, alone))

    def _after_context(self, result: object, job: SecondPassJob | RefineJob
                       ) -> tuple[str, tuple[int, ...]]:
        """The text and tokens a decode gave after its context's (what follows the previous
        segment's text)."""
        tokens = tuple(getattr(result, "tokens", ()))[len(job.context_tokens):]
        if job.context_tokens:
            return self.decoder.text_of(tokens).strip(), tokens  # type: ignore[attr-defined]
        return str(getattr(result, "text", "")).strip(), tokens

    def _word_ends(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        """Where each word of ``tokens`` ends in them (none from a decoder that cannot say)."""
        if not tokens:
            return ()
        return tuple(getattr(self.decoder, "word_ends", lambda t: [])(tokens))

    def _review(self, result: object, job: SecondPassJob
                ) -> tuple[str | None, str, str | None, tuple[int, ...]]:
        """(text, source, rejection, tokens) of a decoded segment: Whisper's text (or ""
        when Whisper judged the segment to hold no speech), a digit string combined with the
        CTC text, or (None, "ctc", reason) when the guard keeps the CTC text; ``tokens`` are
        Whisper's tokens of the text (after any context) when the text is Whisper's own."""
        no_speech_prob = getattr(result, "no_speech_prob", None)
        failed = bool(getattr(result, "failed", False))
        if not failed and self.no_speech.is_no_speech(no_speech_prob,
                                                      getattr(result, "avg_log_prob", 0.0),
                                                      prompted=bool(self._previous(job))):
            self.counters.num_no_speech += 1
            return "", "whisper", None, ()
        text, tokens = self._after_context(result, job)  # the final follows the previous text
        if self.guard is None:
            return text, "whisper", None, tokens if text else ()
        verdict = self.guard.review(text, job.ctc_text, failed, hotwords=job.hotwords)
        if verdict.reason is not None:  # counted by the engine when the final is published
            return None, "ctc", verdict.reason, ()
        respelled = (respell_hotwords(verdict.text, job.ctc_text, job.hotwords)
                     if verdict.source == "whisper" else None)
        if respelled is not None:  # the CTC pass's hotwords where Whisper wrote near misses
            return respelled, "combined", None, ()
        own = verdict.source == "whisper" and verdict.text
        return verdict.text, verdict.source, None, tokens if own else ()

    def _word_probs(self, job: SecondPassJob, result: object | None,
                    tokens: tuple[int, ...]) -> tuple[float, ...]:
        """Per word of a final's own Whisper text (``tokens``, after any context), the
        probability of its least likely generated token; none when the decode gave no
        token probabilities."""
        log_probs = tuple(getattr(result, "token_log_probs", ()))
        if not tokens or not log_probs:
            return ()
        return word_probabilities(self._word_ends(tokens), len(job.prefix), log_probs)

    def _finish(self, job: SecondPassJob, text: str | None, source: str = "whisper",
                rejected: str | None = None, tokens: tuple[int, ...] = (),
                word_probs: tuple[float, ...] = ()) -> None:
        self.emit(SecondPassDone(job.job_id, job.stream_id, text,
                                 time.monotonic() - job.submitted_at, source, rejected,
                                 tokens, self._word_ends(tokens), word_probs))
        published = job.ctc_text if text is None else text  # what the final carries
        waiting = self._deferred.pop(job.job_id, None)
        if waiting is not None:
            self._start(replace(waiting, context=published, context_job=None))
        else:  # the next segment's job may not have arrived yet
            _remember(self._final_texts, job.job_id, published)
