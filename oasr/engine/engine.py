"""ASREngine: many live streams, one batched paged encoder call per step (DESIGN §3).

The model is reached through its family (`oasr.engine.families.base`): features, chunk windows,
frame timing and the position limit are the family's, so the same step serves the Conformer
and Whisper-CTC. Single-threaded core: `submit` is the only method other threads may call;
everything else runs on the thread that calls `step` (the engine thread, or a test /
`oasr transcribe` driving it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from oasr.audio import MODEL_SAMPLE_RATE, ChunkWindower, FeatureWindow, FrameEnergy
from oasr.decoding import Hypothesis, StreamStep
from oasr.engine.commands import AbortStream, AppendAudio, Command, EndStream, FinishAll, OpenStream
from oasr.engine.config import EngineConfig
from oasr.engine.events import BUSY, Done, Error, FinishReason, Partial, Ready
from oasr.engine.families.base import FEATURE_SHIFT_S
from oasr.engine.live.finals import pause_after_last_token
from oasr.engine.runner.isolation import forward_isolating_failures, prepare_or_stop
from oasr.engine.runner.model_runner import BatchPlan
from oasr.engine.live.refine import NO_WORDS, RefinedPartial
from oasr.engine.request import Request, RequestStatus, SegmentAudio
from oasr.engine.scheduler import Scheduler
from oasr.engine.second_pass.worker import MAX_SEGMENT_S, RefineDone, SecondPassDone
from oasr.engine.second_pass_side import SecondPassSide
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.snapshot import EngineSnapshot
from oasr.engine.stats import EngineStats
from oasr.engine.runner.streams import ChunkResult, StreamResources

logger = logging.getLogger(__name__)

SEGMENT_AUDIO_MARGIN_S = 5.0  # audio kept beyond the second pass's window
MAX_LENGTH_REASON = "max_length"  # a segment ended at the model's position limit
# the endpoint count of segments ended at a sentence's end (`EngineConfig.sentence_end_s`)
SENTENCE_END_RULE = "sentence"
# ... a segment ended where its sentence did, the CTC tokens after it no words
# (`FinalPublisher.end_before_noise`)
SENTENCE_BEFORE_NOISE_RULE = "sentence_before_noise"


class ASREngine:
    """Admits streams into slots, steps every ready stream in one encoder call, decodes,
    endpoints and publishes events; frees a stream's caches the moment it ends.

    Invariant: a stream is in ``requests`` from its OpenStream command until it finishes; at
    that moment its blocks, slot, conv state and decoder state are back in their pools.
    """

    def __init__(self, config: EngineConfig, resources: StreamResources | None = None) -> None:
        self.config = config
        self.resources = resources if resources is not None else StreamResources.build(config)
        self.scheduler = Scheduler(config)
        self.requests: dict[int, Request] = {}
        self.draining: dict[int, Request] = {}  # finished streams waiting for their finals
        self.family = self.resources.family
        self._second_pass = SecondPassSide.build(config, self.resources, self.submit)
        self.finals, self.refiner = self._second_pass.finals, self._second_pass.refiner
        self.stats = EngineStats(self.resources, self.finals, self.refiner)
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._geometry = self.family.chunk_geometry(self.resources.chunk_size)
        self._cuts = SegmentCuts(self.resources.endpointer, self._geometry, config.endpoint_quiet)
        self._retain_frames = self._cuts.retain_feature_frames
        self.stats.refresh(self.requests, self.scheduler)

    # -- thread-safe entry points ---------------------------------------------------------------
    def submit(self, command: Command) -> None:
        """Queue a command for the next step (any thread)."""
        self._commands.put(command)
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    def wait_for_work(self, timeout: float) -> None:
        """Sleep until a command arrives or ``timeout`` passes (no busy loop)."""
        self._wakeup.wait(timeout)
        self._wakeup.clear()

    def latest_stats(self) -> EngineSnapshot:
        """The latest snapshot (at most ``SNAPSHOT_INTERVAL_S`` old while the engine steps)."""
        assert self.stats.snapshot is not None  # refreshed in __init__
        return self.stats.snapshot

    @property
    def is_idle(self) -> bool:
        """No live stream and no stream waiting for its finals."""
        return not self.requests and not self.draining

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one engine step. Returns False when there was nothing to do."""
        started = time.perf_counter()
        now = time.monotonic()
        self._apply_commands(now)
        self._extract_features()
        plan = self.scheduler.schedule(self.requests, self.resources.num_free_slots, now)
        for stream_id in plan.admit:
            self._admit(stream_id, now)
        for stream_id in plan.refuse:
            self._refuse_busy(stream_id)
        for stream_id in plan.timed_out:
            self._finish(stream_id, FinishReason.TIMEOUT, plan.timeout_messages.get(stream_id, ""))
        for stream_id in plan.finish:
            self._finish(stream_id, FinishReason.STOP)
        for stream_id in plan.run:
            self._reset_at_position_limit(self.requests[stream_id])
        cohort = [s for s in plan.run if not self._stop_at_capacity(s)]
        audio_s = self._run_cohort(cohort) if cohort else 0.0
        if self._cuts.quiet is not None:
            self._listen_between_chunks(set(cohort))
        self._second_pass.pace(self.requests, now, self.stats.total_busy_s)
        self.stats.record_step(time.perf_counter() - started, len(cohort), audio_s,
                               self.requests, self.scheduler)
        return not plan.is_empty or audio_s > 0

    def _apply_commands(self, now: float) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._apply(command, now)

    def _apply(self, command: Command, now: float) -> None:
        match command:
            case OpenStream():
                self._open(command, now)
            case SecondPassDone():
                self._on_second_pass(command)
            case RefineDone():
                self._on_refined(command)
            case FinishAll():
                for stream_id in list(self.requests):
                    self._finish(stream_id, command.reason, command.message)
            case AppendAudio() | EndStream() | AbortStream():
                request = self.requests.get(command.stream_id)
                if request is None:
                    return  # the stream already finished; late commands are dropped
                if isinstance(command, AppendAudio):
                    self._append_audio(request, command, now)
                elif isinstance(command, EndStream):
                    request.input_ended = True
                else:
                    self._finish(request.stream_id, FinishReason.ABORT)

    def _open(self, command: OpenStream, now: float) -> None:
        request = Request(command.stream_id, command.sink, now, self.family.new_features(),
                          ChunkWindower(self._geometry, self._retain_frames), last_audio_at=now,
                          energy=FrameEnergy(self.family.timing.samples_per_frame))
        if self.finals.worker is not None:
            request.audio = SegmentAudio(
                int((MAX_SEGMENT_S + SEGMENT_AUDIO_MARGIN_S) * MODEL_SAMPLE_RATE))
        if command.endpoint_silence_s is not None:
            request.endpointer = self.resources.endpointer_with_silence(command.endpoint_silence_s)
        if self.refiner is not None:
            request.refine = self.refiner.new_state()
        self.requests[command.stream_id] = request
        self.scheduler.add(request)
        self.stats.mark_changed()  # a snapshot without it could still read "idle" at its end

    def _append_audio(self, request: Request, command: AppendAudio, now: float) -> None:
        if request.input_ended:
            return
        request.pending_audio.append(command.samples)
        request.energy.append(command.samples)
        if self.finals.worker is not None:
            request.audio.append(command.samples)
        request.num_samples_received += len(command.samples)
        request.last_audio_at = now
        pending_s = (request.num_pending_samples / MODEL_SAMPLE_RATE
                     + request.features.num_frames_retained * FEATURE_SHIFT_S)
        if pending_s > self.config.max_pending_audio_s:
            self._fail(request.stream_id, "too_much_audio",
                       f"{pending_s:.1f} s of audio queued and not yet decoded "
                       f"(limit {self.config.max_pending_audio_s:.0f} s): send at real-time pace")

    def _extract_features(self) -> None:
        for stream_id, request in list(self.requests.items()):
            try:
                audio = request.take_pending_audio()
                if audio is not None:
                    request.features.accept_waveform(audio)
                if request.input_ended and not request.features.is_finished:
                    request.features.input_finished()
            except Exception as exc:  # one stream's bad state must not stop the others
                logger.exception("feature extraction failed for stream %d", stream_id)
                self._fail(stream_id, "bad_audio", f"feature extraction failed: {exc}")

    # -- admission and endings -----------------------------------------------------------------
    def _admit(self, stream_id: int, now: float) -> None:
        request = self.requests[stream_id]
        request.slot = self.resources.open_stream(stream_id)
        request.admitted_at = now
        request.transition(RequestStatus.RUNNING)
        chunk_ms = round(self.resources.chunk_size * self.family.timing.frame_shift_s * 1000)
        request.emit(Ready(stream_id, chunk_ms))

    def _refuse_busy(self, stream_id: int) -> None:
        request = self.requests.pop(stream_id)
        request.transition(RequestStatus.FINISHED)
        self.stats.count_refusal()
        request.emit(Error(
            stream_id, BUSY,
            f"all {self.config.max_batch_size} stream slots are busy; try again later"))

    def _stop_at_capacity(self, stream_id: int) -> bool:
        if not self.resources.at_capacity(stream_id):
            return False
        self._finish(stream_id, FinishReason.LENGTH)
        return True

    def _fail(self, stream_id: int, code: str, message: str) -> None:
        request = self.requests.get(stream_id)
        if request is None:
            return
        request.emit(Error(stream_id, code, message))
        self._finish(stream_id, FinishReason.ERROR)

    def _finish(self, stream_id: int, reason: FinishReason, message: str = "") -> None:
        """End a stream: last final (if it said anything), free everything, then done (once
        the second pass has answered for its segments); ``message`` tells the client why."""
        request = self.requests.pop(stream_id, None)
        if request is None:
            return
        self.scheduler.remove(stream_id)
        if request.status is RequestStatus.RUNNING:
            if reason is not FinishReason.ABORT and reason is not FinishReason.ERROR:
                self._emit_final(request, reason.value)
            self.resources.close_stream(stream_id)
        request.transition(RequestStatus.FINISHED)
        request.finish_reason = reason
        request.finish_message = message
        self.stats.count_finish(reason)
        if reason is FinishReason.ABORT:
            self.finals.drop_pending(request)
        if request.pending_finals:
            self.draining[stream_id] = request
        else:
            self._emit_done(request)

    def _emit_done(self, request: Request) -> None:
        assert request.finish_reason is not None
        request.emit(Done(request.stream_id, request.finish_reason.value,
                          request.num_segments_emitted, request.finish_message))

    def _on_second_pass(self, done: SecondPassDone) -> None:
        request = self.requests.get(done.stream_id) or self.draining.get(done.stream_id)
        if request is None:
            return
        self.finals.on_second_pass(request, done)
        early = request.early
        if (self.refiner is not None and request.is_running and early is not None
                and early.done is done
                and self.refiner.apply_early(request, done, early.num_frames)):
            self._emit_partial(request, self.refiner.parts(request))
        if request.is_running and request.last_step is not None:
            self._end_at_sentence(request, request.last_step.hypothesis)
        self.stats.mark_changed()
        if request.is_finished and not request.pending_finals:
            del self.draining[request.stream_id]
            self._emit_done(request)

    def shutdown(self) -> None:
        """Abort every stream (server shutdown) and stop the second pass."""
        self._apply_commands(time.monotonic())
        for stream_id in list(self.requests):
            self._finish(stream_id, FinishReason.ABORT)
        for request in list(self.draining.values()):
            self.finals.drop_pending(request)
            self._emit_done(request)
        self.draining.clear()
        if self.finals.worker is not None:
            self.finals.worker.stop()

    # -- encode, decode, endpoint --------------------------------------------------------------
    def _run_cohort(self, cohort: list[int]) -> float:
        requests = [self.requests[s] for s in cohort]
        plan = BatchPlan(
            stream_ids=cohort,
            slots=[r.slot for r in requests],  # type: ignore[misc]
            windows=[r.windower.pop_window(r.features) for r in requests],  # type: ignore[misc]
            offsets=[r.offset for r in requests],
        )
        runner = self.resources.runner
        plan = prepare_or_stop(runner, plan, self._stop_starved)
        if not plan.stream_ids:
            return 0.0
        plan, output = forward_isolating_failures(runner, plan, self._fail_forward)
        if not plan.stream_ids:
            return 0.0
        runner.commit(plan)
        endpointers = [self.requests[s].endpointer for s in plan.stream_ids]
        results = self.resources.decode(plan.stream_ids, output, endpointers)
        for stream_id, window, result in zip(plan.stream_ids, plan.windows, results, strict=True):
            self._after_chunk(self.requests[stream_id], window, result)
        return sum(plan.num_output_frames) * self.family.timing.frame_shift_s

    def _stop_starved(self, stream_id: int) -> None:
        """No blocks for this stream's chunk: it ends "length", its transcript so far final."""
        self._finish(stream_id, FinishReason.LENGTH)

    def _fail_forward(self, stream_id: int, exc: Exception) -> None:
        self._fail(stream_id, "internal", f"the model failed on this stream: {exc}")

    def _after_chunk(self, request: Request, window: FeatureWindow, result: ChunkResult) -> None:
        frames = window.num_output_frames
        request.offset += frames
        request.num_frames_decoded += frames
        request.last_decoded_at = time.monotonic()
        if (self._cuts.quiet is not None and result.hypothesis is not None
                and result.stats is not None):
            request.last_step = StreamStep(result.hypothesis, result.stats)
        if result.text != request.last_partial or self.refiner is not None:
            request.last_partial = result.text
            if self.refiner is not None:
                parts = self.refiner.compose(request, result.hypothesis)
            else:
                parts = RefinedPartial("", "", result.text)
            self._emit_partial(request, parts)
        decision = result.endpoint
        if decision is not None and not window.is_last:
            self._end_segment(request, "endpoint", self._cuts.cut_frame(request, decision))
            self.stats.count_endpoint(decision.rule)
        else:
            self._cuts.forget_old_energy(request)
            hyp = result.hypothesis
            if not window.is_last:
                request.num_pause_frames = pause_after_last_token(request, hyp)
                if hyp is None or not self._end_at_sentence(request, hyp):
                    self.finals.start_early(request, hyp, len(self.requests))

    def _listen_between_chunks(self, ran: set[int]) -> None:
        """Streams that got no chunk this step: a segment whose pause the audio after its
        last chunk already holds ends now, or starts its early final (`SegmentCuts.in_quiet`).
        Only at a demo's load (``EngineConfig.resolved_light_load_streams``): above it
        segments end at chunks."""
        if len(self.requests) > self.config.resolved_light_load_streams:
            return
        for request in [r for s, r in self.requests.items() if s not in ran and r.is_running]:
            decision, pause = self._cuts.in_quiet(request)
            if decision is not None:
                self._end_segment(request, "endpoint", decision.cut_frame)
                self.stats.count_endpoint(decision.rule, between_chunks=True)
            elif pause is not None and request.last_step is not None:
                # a pause after a word the CTC pass has not decoded yet starts an early
                # decode; it cannot end the segment (the word is not in it yet)
                after_decoded = pause.speech_end <= request.num_frames_decoded
                request.num_pause_frames = pause.frames if after_decoded else 0
                hyp = request.last_step.hypothesis
                if not self._end_at_sentence(request, hyp, between_chunks=True):
                    self.finals.start_early(request, hyp, len(self.requests), pause)

    def _end_at_sentence(self, request: Request, hyp: Hypothesis,
                         between_chunks: bool = False) -> bool:
        """End the open segment now if its early decode ends a sentence and the pause after
        it is long enough (`FinalPublisher.at_sentence_end`), or in the past where a sentence
        ended that the sound since holds no words after (`FinalPublisher.end_before_noise`);
        whether it ended."""
        noise = self.finals.end_before_noise(
            request, self._cuts.max_rewind_frames - self._geometry.chunk_size)
        if noise is not None:
            self._end_segment(request, "endpoint", noise.cut, words_to=noise.words_to)
            self.stats.count_endpoint(SENTENCE_BEFORE_NOISE_RULE, between_chunks)
            return True
        if not self.finals.at_sentence_end(request, hyp, request.num_pause_frames):
            return False
        heard = self._cuts.heard_pause(request, hyp)
        if heard and heard < self.finals.sentence_frames:
            return False  # the audio's measure where it has one: the CTC token's runs long
        self._end_segment(request, "endpoint")
        self.stats.count_endpoint(SENTENCE_END_RULE, between_chunks)
        return True

    def _emit_partial(self, request: Request, parts: RefinedPartial) -> None:
        """Publish the segment's partial when any of its parts changed (so never an empty
        partial at a segment's start, with refinements or without)."""
        if parts == request.last_parts:
            return
        request.last_parts = parts
        end = request.num_frames_decoded * self.family.timing.frame_shift_s
        request.emit(Partial(request.stream_id, request.segment, parts.text, end,
                             stable=parts.stable, tentative=parts.tentative, ctc=parts.ctc))

    def _on_refined(self, done: RefineDone) -> None:
        request = self.requests.get(done.stream_id)
        if request is None or self.refiner is None or not request.is_running:
            return
        if self.refiner.apply(request, done):
            parts = self.refiner.parts(request)
            self._emit_partial(request, parts)

    def _reset_at_position_limit(self, request: Request) -> None:
        """End the segment before a chunk would pass the model's last position (Whisper-CTC:
        1500 frames = 30 s); the stream goes on from position 0 with no audio lost."""
        limit = self.family.max_positions
        if limit is None or request.offset + self.resources.chunk_size <= limit:
            return
        self._end_segment(request, MAX_LENGTH_REASON)
        self.stats.count_endpoint(MAX_LENGTH_REASON)

    def _end_segment(self, request: Request, reason: str, cut_frame: int | None = None,
                     words_to: int | None = None) -> None:
        """Publish the segment's final and start the stream's history over in place.

        Args:
            cut_frame: the segment ends after this many of its frames (None: all decoded);
                fewer means a cut in the past: its final keeps the tokens before the cut and
                the frames after it are decoded again as the next segment's first.
            words_to: the final keeps only the tokens before this frame (at most the cut):
                the CTC pass's tokens after it were no words (`FinalPublisher.end_before_noise`).
        """
        decoded = request.segment_frames
        cut = decoded if cut_frame is None else cut_frame
        assert 0 <= cut <= decoded, (cut, decoded)
        kept = cut if words_to is None else words_to
        assert 0 <= kept <= cut, (kept, cut)
        hyp = self.resources.final_hypothesis(request.stream_id,
                                              None if kept == decoded else kept)
        request.num_frames_decoded = request.segment_start_frame + cut
        self._cuts.forget_words_past(request, cut)
        self._emit_final(request, reason, hyp)
        self.resources.reset_stream(request.stream_id)
        request.offset = 0
        self.finals.release_audio(request, request.segment_start_frame, len(self.requests))
        request.segment_start_frame = request.num_frames_decoded
        if cut < decoded:
            request.windower.rewind(request.num_frames_decoded * self._geometry.subsampling)
        self._cuts.forget_old_energy(request)

    def _emit_final(self, request: Request, reason: str, hyp: Hypothesis | None = None) -> None:
        request.last_partial = ""
        request.last_parts = NO_WORDS  # a new segment's partial is sent once it has words
        request.last_step = None
        request.num_pause_frames = 0
        if hyp is None:
            hyp = self.resources.final_hypothesis(request.stream_id)
        # live streams, this one counted (a finishing stream has left ``requests`` already)
        num_streams = len(self.requests) + (request.stream_id not in self.requests)
        self.finals.publish(request, hyp, reason, num_streams)
        if request.refine is not None:
            request.refine.reset()
