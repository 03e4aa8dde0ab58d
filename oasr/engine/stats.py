"""EngineStats: counters the engine keeps and the snapshot the panel and /metrics read.

The snapshot (an `EngineSnapshot`) is rebuilt on the engine thread at most every
``SNAPSHOT_INTERVAL_S`` and replaced as a whole (one reference assignment), so readers on
other threads always see a consistent, frozen one without a lock.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import time
from typing import TYPE_CHECKING

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.engine.admission import DECODER_WINDOW_S, DecoderLoad, RecentLoad, StepCost
from oasr.engine.events import FinishReason
from oasr.engine.request import Request, RequestStatus
from oasr.engine.snapshot import (
    LAG_BUCKETS_S,
    EngineSnapshot,
    ModelSnapshot,
    PoolSnapshot,
    RefineSnapshot,
    SecondPassSnapshot,
    StepSnapshot,
    StreamEntry,
    StreamsSnapshot,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from oasr.engine.live.policy import LivePolicy
    from oasr.engine.runner.streams import StreamResources
    from oasr.engine.scheduler import Scheduler

SNAPSHOT_INTERVAL_S = 0.1
RTF_WINDOW_S = 5.0
BUSY_WINDOW_S = 2.0  # the steps the batching hold reads the engine's busy share off
LOAD_WINDOW_S = 10.0  # the steps admission by latency measures its cost on
NUM_RECENT_STEPS = 64  # batch widths of the last busy steps in the snapshot (the panel's chart)


class EngineStats:
    """Counters and timing of one engine; ``snapshot`` is what the stats API serves (None
    until the first ``refresh``)."""

    def __init__(self, resources: StreamResources, live: LivePolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.resources = resources
        self.live = live
        self.clock = clock
        self.admission: StepCost | None = None  # admission by latency, when the engine has it
        self.started_at = clock()
        self.lag_counts = [0] * (len(LAG_BUCKETS_S) + 1)  # partials' lag, by bucket
        self.lag_sum_s = 0.0
        self.num_steps = 0
        self.num_busy_steps = 0
        self.num_refused = 0
        self.finish_reasons = {reason.value: 0 for reason in FinishReason}
        self.endpoints: collections.Counter[str] = collections.Counter()
        self.num_quiet_endpoints = 0
        self.last_step_ms = 0.0
        self.avg_step_ms = 0.0
        self.last_batch_size = 0
        self.total_audio_s = 0.0
        self.total_busy_s = 0.0
        self.step_history: collections.deque[tuple[float, float, float, int]] = (
            collections.deque(maxlen=4096))  # (time, seconds, audio_s, batch)
        # (time, the second pass's busy seconds so far, running streams) at each busy step
        self.decoder_history: collections.deque[tuple[float, float, int]] = (
            collections.deque(maxlen=4096))
        self._last_snapshot_at = 0.0
        self._changed = True  # a stream ended: publish at once, not at the next interval
        self.snapshot: EngineSnapshot | None = None

    def count_finish(self, reason: FinishReason) -> None:
        self.finish_reasons[reason.value] += 1
        self._changed = True

    def mark_changed(self) -> None:
        """Publish a new snapshot at the next step, not at the next interval."""
        self._changed = True

    def count_refusal(self) -> None:
        self.num_refused += 1
        self._changed = True

    def count_endpoint(self, rule: str, between_chunks: bool = False) -> None:
        """An endpoint by ``rule``; ``between_chunks``: decided on the quiet audio after the
        last chunk (`SegmentCuts.in_quiet`)."""
        self.endpoints[rule] += 1
        self.num_quiet_endpoints += between_chunks

    def record_step(self, seconds: float, batch_size: int, audio_s: float,
                    requests: dict[int, Request], scheduler: Scheduler) -> None:
        """Account one step; refresh the snapshot when it is due."""
        self.num_steps += 1
        now = self.clock()
        if batch_size:
            self.num_busy_steps += 1
            self.last_step_ms = seconds * 1e3
            self.avg_step_ms += (self.last_step_ms - self.avg_step_ms) * 0.05
            self.last_batch_size = batch_size
            self.total_audio_s += audio_s
            self.total_busy_s += seconds
            self.step_history.append((now, seconds, audio_s, batch_size))
            worker = self.live.finals.worker
            if worker is not None:
                running = sum(r.is_running for r in requests.values())
                self.decoder_history.append((now, worker.busy_seconds, running))
        if self._changed or now - self._last_snapshot_at >= SNAPSHOT_INTERVAL_S:
            self.refresh(requests, scheduler)

    def refresh(self, requests: dict[int, Request], scheduler: Scheduler) -> None:
        """Rebuild the snapshot now."""
        now = self.clock()
        self._last_snapshot_at = now
        self._changed = False
        self.snapshot = self._build_snapshot(now, requests, scheduler)

    def recent_rtf(self, now: float) -> float:
        """Compute seconds per audio second over the last few seconds (0 when idle)."""
        recent = [(s, a) for t, s, a, _ in self.step_history if now - t <= RTF_WINDOW_S]
        audio = sum(a for _, a in recent)
        return sum(s for s, _ in recent) / audio if audio > 0 else 0.0

    def recent_load(self, now: float, window_s: float = LOAD_WINDOW_S) -> RecentLoad:
        """The busy steps of the last ``window_s`` (`oasr.engine.admission.StepCost` reads
        the per-audio cost off them)."""
        busy = audio = 0.0
        steps = 0
        for t, seconds, audio_s, _ in reversed(self.step_history):
            if now - t > window_s:
                break
            busy += seconds
            audio += audio_s
            steps += 1
        return RecentLoad(busy_s=busy, audio_s=audio, num_steps=steps)

    def recent_decoders(self, now: float, window_s: float = DECODER_WINDOW_S) -> DecoderLoad | None:
        """The second pass's decoders over the busy steps of the last ``window_s`` (None
        without a second pass or before two such steps)."""
        worker = self.live.finals.worker
        if worker is None:
            return None
        recent = list(itertools.takewhile(lambda s: now - s[0] <= window_s,
                                          reversed(self.decoder_history)))[::-1]
        if len(recent) < 2:
            return None
        (t0, busy0, _), (t1, busy1, _) = recent[0], recent[-1]
        return DecoderLoad(busy_s=busy1 - busy0, window_s=t1 - t0,
                           num_decoders=worker.num_decoders,
                           avg_streams=sum(s[2] for s in recent) / len(recent))

    def busy_share(self, now: float, window_s: float = BUSY_WINDOW_S) -> float:
        """The share of the last ``window_s`` seconds the engine spent in steps that ran a
        cohort (what scales the scheduler's batching hold)."""
        return min(1.0, self.recent_load(now, window_s).busy_s / window_s)

    def observe_lag(self, lag_s: float) -> None:
        """A chunk was decoded with ``lag_s`` of the stream's audio received after it."""
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS_S, lag_s)] += 1
        self.lag_sum_s += lag_s

    def recent_batch_sizes(self) -> list[int]:
        """Streams in each of the last ``NUM_RECENT_STEPS`` busy steps, oldest first."""
        start = max(0, len(self.step_history) - NUM_RECENT_STEPS)
        return [batch for _, _, _, batch in itertools.islice(self.step_history, start, None)]

    def _build_snapshot(self, now: float, requests: dict[int, Request],
                        scheduler: Scheduler) -> EngineSnapshot:
        res = self.resources
        cfg = res.cache_config
        running = [r for r in requests.values() if r.status is RequestStatus.RUNNING]
        admission = self.admission
        model = None if admission is None else admission.model
        frame_shift_s = res.family.timing.frame_shift_s
        return EngineSnapshot(
            pool=self._pool_entry(),
            streams=StreamsSnapshot(
                active=len(running), waiting=len(scheduler.waiting),
                max_batch_size=cfg.max_batch_size,
                entries=tuple(self._stream_entry(r, frame_shift_s) for r in running),
                suspended=sum(r.is_suspended for r in running),
                admissible=None if admission is None else admission.room(len(running)),
                cost_per_audio_s=None if model is None else model.per_audio_s,
                cost_per_step_s=None if model is None else model.fixed_s,
                lag_counts=tuple(self.lag_counts), lag_sum_s=self.lag_sum_s),
            num_evictions=0 if res.attention is None else res.attention.num_evictions,
            finish_reasons=dict(self.finish_reasons),
            num_refused=self.num_refused,
            endpoints=dict(self.endpoints),
            num_quiet_endpoints=self.num_quiet_endpoints,
            step=StepSnapshot(
                last_ms=round(self.last_step_ms, 3), avg_ms=round(self.avg_step_ms, 3),
                last_batch_size=self.last_batch_size, num_steps=self.num_busy_steps,
                recent_batch_sizes=tuple(self.recent_batch_sizes())),
            second_pass=self._second_pass_entry(running),
            rtf=round(self.recent_rtf(now), 4),
            total_audio_s=round(self.total_audio_s, 2),
            uptime_s=round(now - self.started_at, 1),
            model=ModelSnapshot(
                name=res.config.model or "bundled default", family=res.family.name,
                chunk_ms=round(cfg.chunk_size * res.family.timing.frame_shift_s * 1000),
                device=str(cfg.device), num_left_chunks=cfg.num_left_chunks),
        )

    def _pool_entry(self) -> PoolSnapshot:
        """The paged block pool, or for a slot-runtime family (no paged blocks) its slots."""
        res = self.resources
        cfg = res.cache_config
        states = res.states
        slot_owners: list[int | None] = [None] * states.num_slots
        for stream_id in states.stream_ids:
            slot_owners[states.slot_of(stream_id)] = stream_id
        num_used_slots = states.num_slots - res.num_free_slots
        if res.pool is None or res.attention is None:
            return PoolSnapshot(
                kind="slots", num_blocks=0, num_used_blocks=0, num_free_blocks=0,
                block_size_frames=0, owners=(), num_slots=states.num_slots,
                num_used_slots=num_used_slots, slot_owners=tuple(slot_owners),
                state_bytes=sum(b.nbytes for b in states.buffers.values()))
        return PoolSnapshot(
            kind="paged", num_blocks=cfg.max_num_blocks,
            num_used_blocks=cfg.max_num_blocks - res.pool.num_free_blocks,
            num_free_blocks=res.pool.num_free_blocks, block_size_frames=cfg.block_size_frames,
            owners=tuple(res.attention.block_owner_snapshot()[: cfg.max_num_blocks]),
            num_slots=states.num_slots, num_used_slots=num_used_slots,
            slot_owners=tuple(slot_owners))

    def _second_pass_entry(self, running: list[Request]) -> SecondPassSnapshot:
        finals = self.live.finals
        done = finals.num_second_pass
        worker = finals.worker
        return SecondPassSnapshot(
            enabled=worker is not None,
            backlog=worker.backlog if worker is not None else 0,
            num_second_pass_finals=done,
            num_first_pass_finals=finals.num_first_pass,
            num_backlog_full=finals.num_backlog_full,
            num_temperature_fallbacks=worker.num_temperature_fallbacks if worker is not None else 0,
            num_rejected=sum(finals.rejected.values()),
            num_combined=finals.num_by_source.get("combined", 0),
            num_with_context=worker.num_with_context if worker is not None else 0,
            num_early_finals=finals.num_early_used,
            num_early_discarded=finals.num_early_discarded,
            finals_by_source=dict(finals.num_by_source),
            rejected=dict(finals.rejected),
            num_no_voice=worker.num_no_voice if worker is not None else 0,
            num_no_speech=worker.num_no_speech if worker is not None else 0,
            avg_latency_ms=(round(finals.second_pass_seconds / done * 1e3, 1) if done
                            else 0.0),
            held=worker.held if worker is not None else False,
            num_holds=worker.num_holds if worker is not None else 0,
            held_s=round(worker.held_seconds, 3) if worker is not None else 0.0,
            num_expired=worker.num_expired if worker is not None else 0,
            num_evicted=worker.num_evicted if worker is not None else 0,
            num_decoders=worker.num_decoders if worker is not None else 0,
            num_decodes_cancelled=worker.num_cancelled if worker is not None else 0,
            num_context_retries=worker.num_context_retries if worker is not None else 0,
            num_beam_retries=worker.num_beam_retries if worker is not None else 0,
            busy_s=round(worker.busy_seconds, 3) if worker is not None else 0.0,
            refine=self._refine_entry(running),
        )

    def _refine_entry(self, running: list[Request]) -> RefineSnapshot | None:
        refiner = self.live.refiner
        if refiner is None:
            return None
        streams = [self.live.streams[r.stream_id] for r in running]
        states = [s.refine for s in streams if s.refine is not None]
        return RefineSnapshot(
            num_refining=sum(s.in_flight is not None for s in states),
            num_refined_streams=sum(s.num_refinements > 0 for s in states),
            num_refinements=refiner.worker.num_refinements,
            refine_interval_s=round(refiner.avg_interval_s, 2),
        )

    def _stream_entry(self, request: Request, frame_shift_s: float) -> StreamEntry:
        received_s = request.num_samples_received / MODEL_SAMPLE_RATE
        decoded_s = request.num_frames_decoded * frame_shift_s
        attention = self.resources.attention
        return StreamEntry(
            stream_id=request.stream_id,
            slot=request.slot,
            num_blocks=(0 if attention is None else
                        len(attention.stream_info(request.stream_id).block_ids)),
            audio_s=round(received_s, 2),
            lag_s=round(max(0.0, received_s - decoded_s), 2),
            segment=self.live.segment(request.stream_id),
        )
