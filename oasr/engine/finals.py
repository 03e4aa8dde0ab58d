"""Segment finals: the CTC text at once, or Whisper's text when the second pass is on.

Finals of one stream are published in segment order: a segment whose second pass finishes
early waits for the segments before it. A stream's ``done`` follows its last final.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.decoding import Hypothesis
from oasr.engine.events import Final
from oasr.engine.family import FrameTiming
from oasr.engine.final_guard import SOURCES
from oasr.engine.request import PendingFinal, Request
from oasr.engine.second_pass import MAX_SEGMENT_S, SecondPassDone, SecondPassJob, SecondPassWorker
from oasr.engine.words import WordTime, ctc_word_times


class FinalPublisher:
    """Turns a finished segment into its final event, through the second pass when it is on.

    Times come from encoder frames through the model family's ``timing`` (40 ms Conformer
    frames, 20 ms Whisper-CTC frames). Counters (for stats): ``num_second_pass`` finals that carry the second pass's text (Whisper's, or digits combined with the CTC text),
    ``num_first_pass`` finals that kept the CTC text (second pass off, backlog full, segment
    too long, Whisper raised, or the guard rejected its text), ``num_backlog_full`` segments
    not queued because the backlog was full, ``second_pass_seconds`` summed latency,
    ``num_by_source`` published finals by their ``source`` ("whisper", "ctc", "combined").
    """

    def __init__(self, worker: SecondPassWorker | None, timing: FrameTiming,
                 tokenizer: Any = None) -> None:
        self.worker = worker
        self.timing = timing
        self.tokenizer = tokenizer  # for the CTC words' times; None: finals carry no words
        self._job_ids = itertools.count(1)
        self.num_backlog_full = 0
        self.second_pass_seconds = 0.0
        self.num_by_source = dict.fromkeys(SOURCES, 0)

    def publish(self, request: Request, hyp: Hypothesis, reason: str) -> None:
        """The segment that just ended: publish or queue its final, advance the segment.

        With the second pass on, a segment the CTC pass heard nothing in still goes to Whisper
        when its audio is loud enough to hold speech (a weak first pass must not lose it).
        """
        audio = None
        if self.worker is not None:
            audio = self._segment_audio(request)
            if audio is not None and not hyp.text and not self.worker.no_speech.has_voice(audio):
                audio = None  # the worker's own voice rule: it would answer "" undecoded
        if audio is None and not hyp.text:
            return
        base = request.segment_start_frame
        shift = self.timing.frame_shift_s
        first = base + (hyp.timestamps[0] if hyp.timestamps else 0)
        last = base + (hyp.timestamps[-1] + 1 if hyp.timestamps else 0)
        event = Final(request.stream_id, request.segment, hyp.text, first * shift,
                      max(last, first) * shift, reason, "ctc", self._words(hyp, base))
        if not hyp.timestamps:  # nothing decoded: the segment's own span
            event = replace(event, start=base * shift, end=request.num_frames_decoded * shift)
        if audio is not None and self.worker is not None:
            prefix = request.refine.prefix_tokens if request.refine is not None else ()
            job = SecondPassJob(self.next_job_id(), request.stream_id, request.segment, audio,
                                time.monotonic(), hyp.text, prefix)
            if self.worker.try_submit(job):
                request.segment += 1
                request.pending_finals[job.job_id] = PendingFinal(event)
                return
            self.num_backlog_full += 1
        if hyp.text:
            request.segment += 1
            self._emit(request, event)

    def _words(self, hyp: Hypothesis, base: int) -> tuple[WordTime, ...]:
        if self.tokenizer is None or not hasattr(self.tokenizer, "raw_text"):
            return ()
        return ctc_word_times(self.tokenizer, hyp.tokens, hyp.timestamps, base,
                              self.timing.frame_shift_s)

    def next_job_id(self) -> int:
        """A new second-pass job id (finals and refinements share the sequence)."""
        return next(self._job_ids)

    def on_second_pass(self, request: Request, done: SecondPassDone) -> None:
        """Whisper's answer for one of the request's segments; publish what is now in order."""
        pending = request.pending_finals.get(done.job_id)
        if pending is None:
            return
        self.second_pass_seconds += done.seconds
        pending.text = done.text
        pending.source = done.source
        pending.answered = True
        self.flush(request)

    def flush(self, request: Request) -> None:
        """Publish the leading finals whose second pass has answered.

        Whisper's text replaces the CTC text; "" (no speech) empties the final; None (Whisper
        raised, or the guard rejected its text) keeps the CTC text. Every queued segment gets its final, so its number is used.
        """
        while request.pending_finals:
            job_id, pending = next(iter(request.pending_finals.items()))
            if not pending.answered:
                return
            del request.pending_finals[job_id]
            event = pending.event
            if pending.text is not None:
                event = replace(event, text=pending.text, source=pending.source)
            self._emit(request, event)

    def drop_pending(self, request: Request) -> None:
        """The stream vanished: forget its queued segments."""
        for job_id in request.pending_finals:
            if self.worker is not None:
                self.worker.abort(job_id)
        request.pending_finals.clear()

    def _segment_audio(self, request: Request) -> np.ndarray | None:
        """The current segment's samples (a copy), or None if it is too long or not held."""
        per_frame = self.timing.samples_per_frame
        start = request.segment_start_frame * per_frame
        end = request.num_frames_decoded * per_frame + self.timing.right_context_samples
        if (end - start) / MODEL_SAMPLE_RATE > MAX_SEGMENT_S:
            return None
        audio = request.audio.slice(start, end)
        return audio.copy() if audio is not None and audio.size else None

    @property
    def num_second_pass(self) -> int:
        """Finals with the second pass's text (Whisper's, or a combined digit string)."""
        return sum(n for source, n in self.num_by_source.items() if source != "ctc")

    @property
    def num_first_pass(self) -> int:
        """Finals that kept the CTC text."""
        return self.num_by_source["ctc"]

    def _emit(self, request: Request, event: Final) -> None:
        self.num_by_source[event.source] = self.num_by_source.get(event.source, 0) + 1
        request.num_segments_emitted += 1
        request.emit(event)
