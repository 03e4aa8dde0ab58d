"""ASREngine: many live streams, one batched paged encoder call per step.

One step: apply the queued commands, extract features, schedule (admit, refuse, time out,
finish), run every ready stream's chunk in one encoder call and one batched decode, hand each
result to the live-text policy (`oasr.engine.live.LivePolicy`), end the segments it decides,
and publish. The model is reached through its family (`oasr.engine.families`) and the runner
(`oasr.engine.runner.StreamResources`); the policy decides partials, segment ends and finals,
the loop does what they mean for a stream's caches and positions.

Single-threaded core: `submit` is the only method other threads may call; everything else
runs on the thread that calls `step` (the engine thread, or a test / `oasr transcribe`
driving it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from oasr.audio import MODEL_SAMPLE_RATE, ChunkWindower, accept_waveforms
from oasr.engine.admission import SecondPassCost, StepCost, StepCostModel
from oasr.engine.commands import (
    AbortStream,
    AppendAudio,
    Command,
    EndStream,
    FinishAll,
    OpenStream,
    ResumeStream,
    SetHotwords,
    SuspendStream,
)
from oasr.engine.config import EngineConfig
from oasr.engine.events import BUSY, Done, Error, FinishReason, Ready
from oasr.engine.families.base import FEATURE_SHIFT_S
from oasr.engine.live.finals import FinalPublisher
from oasr.engine.live.policy import LivePolicy, SegmentEnd, YieldRule
from oasr.engine.live.posteriors import TOP_K
from oasr.engine.live.posteriors import ensure_compiled as ensure_peaks_compiled
from oasr.engine.live.refine import Refiner
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.request import Request, RequestStatus
from oasr.engine.runner.isolation import prepare_or_stop, step_isolating_failures
from oasr.engine.runner.model_runner import BatchPlan, StepOutput
from oasr.engine.runner.streams import ChunkResult, StreamResources
from oasr.engine.scheduler import Scheduler, max_steps_per_s
from oasr.engine.second_pass.jobs import Answer
from oasr.engine.second_pass.worker import RefineDone, SecondPassDone, SecondPassWorker
from oasr.engine.snapshot import EngineSnapshot
from oasr.engine.stats import EngineStats

logger = logging.getLogger(__name__)

MAX_LENGTH_REASON = "max_length"  # a segment ended at the model's position limit
BUSY_RETRY_S = 5.0  # the retry hint of a "busy" refusal, seconds
CALIBRATION_AUDIO_S = 2.0  # audio each calibration stream decodes (`ASREngine.calibrate`)
Clock = Callable[[], float]


class ASREngine:
    """Admits streams into slots, steps every ready stream in one encoder call, decodes,
    lets the live policy publish and end segments, and frees a stream's caches the moment it
    ends.

    Invariant: a stream is in ``requests`` from its OpenStream command until it finishes; at
    that moment its blocks, slot, conv state and decoder state are back in their pools (its
    finals may still wait for the second pass, in ``draining``).

    Args:
        config: how the engine runs.
        resources: the runner's per-stream resources; None builds them from ``config``.
        clock: monotonic seconds, for every time the engine measures (timeouts, rates, the
            second pass's timing); tests pass a fake one.
    """

    def __init__(self, config: EngineConfig, resources: StreamResources | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.resources = resources if resources is not None else StreamResources.build(config)
        self.requests: dict[int, Request] = {}
        self.draining: dict[int, Request] = {}  # finished streams waiting for their finals
        self.family = self.resources.family
        self._geometry = self.family.chunk_geometry(self.resources.chunk_size)
        self.scheduler = Scheduler(config, self.family.timing.frame_shift_s
                                   / self._geometry.subsampling)
        self.hold_s: float | None = None  # the last step held its ready chunks this long
        self.live = build_live_policy(config, self.resources, self.submit, clock)
        self.stats = EngineStats(self.resources, self.live, clock)
        self.admission = None
        if config.admission_budget:  # None or 0: slots alone decide
            second_pass = None
            if config.admission_second_pass_budget and self.live.finals.worker is not None:
                second_pass = SecondPassCost(
                    lambda: self.stats.recent_decoders(self.clock()),
                    config.admission_second_pass_budget,
                    min_streams=config.refine.max_streams if config.refine is not None else 0)
            self.admission = StepCost(
                lambda: self.stats.recent_load(self.clock()), config.admission_budget,
                chunk_s=self.resources.chunk_size * self.family.timing.frame_shift_s,
                max_steps_per_s=max_steps_per_s(config), second_pass=second_pass)
        self.stats.admission = self.admission
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self.stats.refresh(self.requests, self.scheduler)

    # -- thread-safe entry points ---------------------------------------------------------------
    def submit(self, command: Command) -> None:
        """Queue a command for the next step (any thread)."""
        self._commands.put(command)
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    def wait_for_work(self, timeout: float) -> None:
        """Sleep until a command arrives or ``timeout`` passes (no busy loop); no longer than
        the last step's hold of ready chunks (`Scheduler.hold_s`)."""
        if self.hold_s is not None:
            timeout = min(timeout, self.hold_s)
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
    @torch.inference_mode()
    def step(self) -> bool:
        """Run one engine step. Returns False when there was nothing to do.

        The step runs in torch's inference mode: no autograd bookkeeping on any of its ops
        (the CTC search's small ops run 10-20 % faster). So do `calibrate` and `shutdown`,
        the engine's other entries that touch its tensors."""
        started = time.perf_counter()
        now = self.clock()
        self._apply_commands(now)
        self._extract_features(now)
        plan = self.scheduler.schedule(self.requests, self._num_admissible(), now,
                                       lambda: self.stats.busy_share(now))
        self.hold_s = plan.hold_s
        for stream_id in plan.admit:
            self._admit(stream_id, now)
        for stream_id in plan.refuse:
            self._refuse_busy(stream_id)
        for stream_id in plan.timed_out:
            self._finish(stream_id, FinishReason.TIMEOUT, plan.timeout_messages.get(stream_id, ""))
        for stream_id in plan.abandoned:
            self._finish(stream_id, FinishReason.ABANDONED,
                         "the client did not come back within the resume window")
        for stream_id in plan.finish:
            self._finish(stream_id, FinishReason.STOP)
        for stream_id in plan.run:
            self._reset_at_position_limit(self.requests[stream_id])
        cohort = [s for s in plan.run if not self._stop_at_capacity(s)]
        audio_s = self._run_cohort(cohort) if cohort else 0.0
        self._listen_between_chunks(set(cohort))
        self.live.after_step(self.requests, now, self.stats.total_busy_s)
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
            case SetHotwords():
                self._set_hotwords(command)
            case SecondPassDone():
                self._on_second_pass(command)
            case RefineDone():
                self.live.on_refined(command)
            case FinishAll():
                for stream_id in list(self.requests):
                    self._finish(stream_id, command.reason, command.message)
            case SuspendStream() | ResumeStream():
                request = self.requests.get(command.stream_id)
                if request is not None:
                    self._suspend_or_resume(request, command, now)
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
                          ChunkWindower(self._geometry, self.live.retain_feature_frames),
                          last_audio_at=now)
        endpointer = None
        if command.endpoint_silence_s is not None:
            endpointer = self.resources.endpointer_with_silence(command.endpoint_silence_s)
        self.live.open(request, endpointer)
        request.hotwords = command.hotwords
        if command.hotwords is not None:
            self.live.set_hotwords(command.stream_id, command.hotwords)
        self.requests[command.stream_id] = request
        self.scheduler.add(request)
        self.stats.mark_changed()  # a snapshot without it could still read "idle" at its end

    def _set_hotwords(self, command: SetHotwords) -> None:
        """A stream's new hotwords: its next chunk is searched with them (a stream still
        waiting for a slot gets them when admitted) and its next second-pass jobs carry them."""
        request = self.requests.get(command.stream_id)
        if request is None:
            return  # the stream already finished
        request.hotwords = command.hotwords
        self.live.set_hotwords(command.stream_id, command.hotwords)
        if request.is_running:
            self.resources.set_hotwords(command.stream_id, command.hotwords.graph)

    def _append_audio(self, request: Request, command: AppendAudio, now: float) -> None:
        if request.input_ended:
            return
        request.pending_audio.append(command.samples)
        request.num_samples_received += len(command.samples)
        request.last_audio_at = now
        pending_s = (request.num_pending_samples / MODEL_SAMPLE_RATE
                     + request.features.num_frames_retained * FEATURE_SHIFT_S)
        if pending_s > self.config.max_pending_audio_s:
            self._fail(request.stream_id, "too_much_audio",
                       f"{pending_s:.1f} s of audio queued and not yet decoded "
                       f"(limit {self.config.max_pending_audio_s:.0f} s): send at real-time pace")

    def _extract_features(self, now: float) -> None:
        """Every stream's new audio to features, in one call where the family's extractor
        computes many streams at once (`accept_waveforms`); a stream whose audio fails fails
        alone. The live policy gets each stream's audio of the step joined, once (a client's
        messages of about 100 ms are six or seven a chunk: numpy's per-call cost of the
        energies then counts once)."""
        fed = [(stream_id, audio) for stream_id, request in self.requests.items()
               if (audio := request.take_pending_audio()) is not None]
        self.live.on_audio(fed, now)
        errors = accept_waveforms([self.requests[s].features for s, _ in fed],
                                  [audio for _, audio in fed])
        for (stream_id, _), exc in zip(fed, errors, strict=True):
            if exc is not None:
                self._features_failed(stream_id, exc)  # it leaves ``requests``
        for stream_id, request in list(self.requests.items()):
            if request.input_ended and not request.features.is_finished:
                try:
                    request.features.input_finished()
                except Exception as exc:  # one stream's bad state must not stop the others
                    self._features_failed(stream_id, exc)

    def _features_failed(self, stream_id: int, exc: Exception) -> None:
        logger.error("feature extraction failed for stream %d", stream_id, exc_info=exc)
        self._fail(stream_id, "bad_audio", f"feature extraction failed: {exc}")

    def _suspend_or_resume(self, request: Request, command: SuspendStream | ResumeStream,
                           now: float) -> None:
        """A suspended stream keeps everything and waits for its client (no idle or rate
        rule judges it); resumed, both rules start afresh from now."""
        if isinstance(command, SuspendStream):
            request.suspended_until = now + command.window_s
        elif request.suspended_until is not None:
            request.suspended_until = None
            request.last_audio_at = now
            request.rate_window_start = now
            request.rate_window_samples = request.num_samples_received
        self.stats.mark_changed()

    # -- admission and endings -----------------------------------------------------------------
    def _num_admissible(self) -> int:
        """Waiting streams that may be admitted this step: the free slots, and, with
        admission by latency, no more than the step's cost allows beside those running."""
        free = self.resources.num_free_slots
        if self.admission is None:
            return free
        running = sum(r.is_running for r in self.requests.values())
        return min(free, self.admission.room(running))

    def _admit(self, stream_id: int, now: float) -> None:
        request = self.requests[stream_id]
        request.slot = self.resources.open_stream(stream_id)
        if request.hotwords is not None and request.hotwords.graph is not None:
            self.resources.set_hotwords(stream_id, request.hotwords.graph)
        request.admitted_at = now
        request.transition(RequestStatus.RUNNING)
        chunk_ms = round(self.resources.chunk_size * self.family.timing.frame_shift_s * 1000)
        hotwords = request.hotwords.terms if request.hotwords is not None else ()
        request.emit(Ready(stream_id, chunk_ms, hotwords=hotwords))

    def _refuse_busy(self, stream_id: int) -> None:
        request = self.requests.pop(stream_id)
        request.transition(RequestStatus.FINISHED)
        self.live.close(stream_id)
        self.stats.count_refusal()
        if self.resources.num_free_slots > 0:  # slots free: the step's cost is the limit
            running = sum(r.is_running for r in self.requests.values())
            message = (f"the server is at its real-time capacity ({running} streams on this "
                       f"machine); try again in {BUSY_RETRY_S:g} s")
        else:
            message = (f"all {self.config.max_batch_size} stream slots are busy; try again in "
                       f"{BUSY_RETRY_S:g} s")
        request.emit(Error(stream_id, BUSY, message, retry_after_s=BUSY_RETRY_S))

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
                # live streams, this one counted (it has left ``requests`` already)
                self.live.final_at_finish(stream_id, self.resources.final_hypothesis(stream_id),
                                          reason.value, len(self.requests) + 1)
            self.resources.close_stream(stream_id)
        request.transition(RequestStatus.FINISHED)
        request.finish_reason = reason
        request.finish_message = message
        self.stats.count_finish(reason)
        if reason is FinishReason.ABORT:
            self.live.drop(stream_id)
        if self.live.has_pending(stream_id):
            self.draining[stream_id] = request
        else:
            self._emit_done(request)

    def _emit_done(self, request: Request) -> None:
        assert request.finish_reason is not None
        num_segments = self.live.close(request.stream_id)
        request.emit(Done(request.stream_id, request.finish_reason.value, num_segments,
                          request.finish_message))

    def _on_second_pass(self, done: SecondPassDone) -> None:
        request = self.requests.get(done.stream_id) or self.draining.get(done.stream_id)
        if request is None:
            return
        end = self.live.on_second_pass(done)
        if end is not None:
            self._end_segment(request, end)
        self.stats.mark_changed()
        if request.is_finished and not self.live.has_pending(request.stream_id):
            del self.draining[request.stream_id]
            self._emit_done(request)

    @torch.inference_mode()
    def calibrate(self, num_streams: int | None = None,
                  seconds: float = CALIBRATION_AUDIO_S) -> StepCostModel:
        """Measure the step's cost before serving: one stream, then ``num_streams`` (default:
        up to 8, within the slots) stepped together as live streams would be, each
        ``seconds`` of faint noise; the two loads' busy time, steps and audio give the fixed
        and the per-audio part of a step's cost (`StepCostModel.fit`), which seed admission
        by latency (`StepCost.seed`) until real steps measure it. The streams leave nothing
        behind: their slots and blocks are free again and the stats start afresh.

        Returns:
            The measured model.
        Raises:
            RuntimeError: streams are live (calibrate before serving).
        """
        if not self.is_idle:
            raise RuntimeError("calibrate before serving: streams are live")
        count = num_streams or min(8, self.config.max_batch_size)
        noise = (1e-3 * np.random.default_rng(0).standard_normal(
            int(seconds * MODEL_SAMPLE_RATE))).astype(np.float32)
        widths = (1, count)
        for n in widths:  # warm-up: each width's first calls
            self._step_streams_of(n, noise[: MODEL_SAMPLE_RATE // 2])
        loads = [(*self._step_streams_of(n, noise), n * seconds) for n in widths]
        model = StepCostModel.fit(loads[0], loads[1])
        self.stats = EngineStats(self.resources, self.live, self.clock)
        self.stats.admission = self.admission
        self.stats.refresh(self.requests, self.scheduler)
        if self.admission is not None:
            self.admission.seed = model
        return model

    def _step_streams_of(self, count: int, audio: np.ndarray) -> tuple[float, int]:
        """Step ``count`` streams of ``audio`` each until done: the seconds the busy steps
        took and how many there were."""
        for stream_id in range(-1, -count - 1, -1):  # never a client's id (those count from 1)
            self.submit(OpenStream(stream_id, lambda event: None))
            self.submit(AppendAudio(stream_id, audio))
            self.submit(EndStream(stream_id))
        busy, steps = 0.0, 0
        while True:
            started = time.perf_counter()
            busy_steps = self.stats.num_busy_steps
            self.step()
            if self.stats.num_busy_steps > busy_steps:
                busy += time.perf_counter() - started
                steps += 1
            if self.is_idle and self._commands.empty():
                return busy, steps

    @torch.inference_mode()
    def shutdown(self) -> None:
        """Abort every stream (server shutdown) and stop the second pass."""
        self._apply_commands(self.clock())
        for stream_id in list(self.requests):
            self._finish(stream_id, FinishReason.ABORT)
        for request in list(self.draining.values()):
            self.live.drop(request.stream_id)
            self._emit_done(request)
        self.draining.clear()
        self.live.shutdown()

    # -- encode, decode, end segments ----------------------------------------------------------
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
        # encode, decode, then commit: a row whose chunk fails keeps its state as before
        plan, results = step_isolating_failures(runner, plan, self._decode, self._fail_forward)
        if not plan.stream_ids:
            return 0.0
        now = self.clock()
        per_frame = self.family.timing.samples_per_frame
        for stream_id, window, result in zip(plan.stream_ids, plan.windows, results, strict=True):
            request = self.requests[stream_id]
            request.offset += window.num_output_frames
            request.num_frames_decoded += window.num_output_frames
            request.last_decoded_at = now
            behind = request.num_samples_received - request.num_frames_decoded * per_frame
            self.stats.observe_lag(max(0, behind) / MODEL_SAMPLE_RATE)
            end = self.live.after_chunk(stream_id, result.text, result.hypothesis, result.stats,
                                        result.endpoint, window.is_last, len(self.requests))
            if end is not None:
                self._end_segment(request, end)
        return sum(plan.num_output_frames) * self.family.timing.frame_shift_s

    def _decode(self, plan: BatchPlan, output: StepOutput) -> list[ChunkResult]:
        endpointers = [self.live.endpointer(s) for s in plan.stream_ids]
        results = self.resources.decode(plan.stream_ids, output, endpointers)
        if self.resources.transducer is None:  # (a transducer's output is no CTC posterior)
            self._record_posteriors(plan, output)
        return results

    def _record_posteriors(self, plan: BatchPlan, output: StepOutput) -> None:
        """Hand the policy each row's best CTC log-probs per frame (one read-back for the
        cohort): its words' confidence."""
        best = output.log_probs.topk(min(TOP_K, output.log_probs.shape[-1]), dim=-1)
        ids, log_probs = best.indices.cpu().numpy(), best.values.float().cpu().numpy()
        for row, stream_id in enumerate(plan.stream_ids):
            frames = int(output.lengths[row])
            self.live.on_posteriors(stream_id, self.requests[stream_id].num_frames_decoded,
                                    ids[row, :frames], log_probs[row, :frames])

    def _stop_starved(self, stream_id: int) -> None:
        """No blocks for this stream's chunk: it ends "length", its transcript so far final."""
        self._finish(stream_id, FinishReason.LENGTH)

    def _fail_forward(self, stream_id: int, exc: Exception) -> None:
        self._fail(stream_id, "internal", f"the model failed on this stream: {exc}")

    def _listen_between_chunks(self, ran: set[int]) -> None:
        """Streams that got no chunk this step: the policy may end their segments on the quiet
        audio after their last chunk (only at a demo's load)."""
        if not self.live.listens_between_chunks(len(self.requests)):
            return
        for request in [r for s, r in self.requests.items() if s not in ran and r.is_running]:
            end = self.live.between_chunks(request.stream_id, len(self.requests))
            if end is not None:
                self._end_segment(request, end)

    def _reset_at_position_limit(self, request: Request) -> None:
        """End the segment before a chunk would pass the model's last position (Whisper-CTC:
        1500 frames = 30 s) or the frames its decoder was built for
        (`StreamResources.max_segment_frames`); the stream goes on from position 0 with no
        audio lost."""
        limit = self.resources.max_segment_frames or self.family.max_positions
        if limit is None or request.offset + self.resources.chunk_size <= limit:
            return
        self._end_segment(request, SegmentEnd(MAX_LENGTH_REASON, reason=MAX_LENGTH_REASON))

    def _end_segment(self, request: Request, end: SegmentEnd) -> None:
        """End the open segment where ``end`` says, publish its final (the policy) and start
        the stream's history over in place: frames after a cut in the past are decoded again
        as the next segment's first."""
        decoded = request.segment_frames
        cut = decoded if end.cut_frame is None else end.cut_frame
        assert 0 <= cut <= decoded, (cut, decoded)
        kept = cut if end.words_to is None else end.words_to
        assert 0 <= kept <= cut, (kept, cut)
        hyp = self.resources.final_hypothesis(request.stream_id,
                                              None if kept == decoded else kept)
        request.num_frames_decoded = request.segment_start_frame + cut
        self.live.end_segment(request.stream_id, hyp, end.reason, cut, len(self.requests))
        self.resources.reset_stream(request.stream_id)
        request.offset = 0
        request.segment_start_frame = request.num_frames_decoded
        if cut < decoded:
            request.windower.rewind(request.num_frames_decoded * self._geometry.subsampling)
        self.stats.count_endpoint(end.rule, end.between_chunks)


def build_live_policy(config: EngineConfig, resources: StreamResources,
                      deliver: Callable[[Answer], None], clock: Clock = time.monotonic
                      ) -> LivePolicy:
    """The live-text policy ``config`` asks for: the Whisper second pass when it is on
    (answering through ``deliver``, the engine's ``submit``; its guard gets the CTC pass's
    LM setting, which its distance check needs), the finals in front of it, the refiner of
    open segments' partials, and the segment cuts."""
    worker = None
    if config.second_pass == "whisper":
        guard = config.final_guard
        if guard is not None:
            guard = guard.for_first_pass(resources.ctc.decoder.has_lm)
        worker = SecondPassWorker.load(deliver, config.resolved_second_pass_max_backlog,
                                       resources.cache_config.device,
                                       config.second_pass_decode_config(), guard,
                                       config.resolved_num_threads, config.second_pass_fast_backlog,
                                       config.second_pass_process, config.second_pass_nice,
                                       config.second_pass_processes, clock)
    timing, tokenizer = resources.family.timing, resources.family.tokenizer
    finals = FinalPublisher(worker, timing, tokenizer, config.final_context_s,
                            config.early_final_s, config.resolved_light_load_streams,
                            config.light_load_context_s, config.sentence_end_s, clock=clock)
    refiner = None
    if worker is not None and config.refine is not None:
        refiner = Refiner(config.refine, worker, timing, tokenizer, finals.next_job_id,
                          finals.known_context, clock=clock)
    geometry = resources.family.chunk_geometry(resources.chunk_size)
    ensure_peaks_compiled()  # the word times' search, before the first partial needs it
    cuts = SegmentCuts(resources.endpointer, geometry, config.endpoint_quiet)
    return LivePolicy(finals, refiner, cuts, timing, geometry.chunk_size,
                      YieldRule.of(config.second_pass_yield_s, resources.chunk_size, timing),
                      config.resolved_light_load_streams)
