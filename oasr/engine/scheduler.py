"""Scheduler: admission by stream slots, waiting and refusal, timeouts, and the step's cohort.

Policy only: it decides which streams enter, wait, time out or run this step, and hands the
decision to the engine as a `SchedulerOutput`. It never touches caches or the model.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.engine.config import EngineConfig
from oasr.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerOutput:
    """What one step does, by stream id.

    Attributes:
        admit: waiting streams that get a slot now (oldest first).
        refuse: waiting streams that waited ``max_wait_time_s`` for a slot (busy).
        timed_out: running or waiting streams past the idle timeout or the session limit.
        abandoned: suspended streams whose client did not come back within the window.
        finish: running streams whose input ended and whose every window was decoded.
        run: running streams with an encoder window ready (the step's cohort).
        timeout_messages: why each of ``timed_out`` timed out, for its client.
        hold_s: the ready streams are held (``run`` is empty) for at most this many seconds,
            so that streams due within them join the step (`Scheduler.hold_s`); None: no hold.
    """

    admit: list[int] = field(default_factory=list)
    refuse: list[int] = field(default_factory=list)
    timed_out: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)
    finish: list[int] = field(default_factory=list)
    run: list[int] = field(default_factory=list)
    timeout_messages: dict[int, str] = field(default_factory=dict)
    hold_s: float | None = None

    @property
    def is_empty(self) -> bool:
        return not (self.admit or self.refuse or self.timed_out or self.abandoned
                    or self.finish or self.run)


# the engine's busy share from which the batching hold is the whole ``batch_window_s``
BUSY_FOR_FULL_WINDOW = 0.5


def hold_window_s(config: EngineConfig, busy_share: float) -> float:
    """The batching hold's window at the engine's ``busy_share``: ``batch_window_s`` scaled
    by it, in full from `BUSY_FOR_FULL_WINDOW` up."""
    return config.batch_window_s * min(1.0, busy_share / BUSY_FOR_FULL_WINDOW)


def max_steps_per_s(config: EngineConfig) -> float | None:
    """The most busy steps a second the batching hold lets the engine take while it is as
    busy as the admission budget allows: one per hold window (`Scheduler.hold_s`: a ready
    chunk waits the window for the streams due within it). None without a hold or a budget."""
    if not config.batch_window_s or not config.admission_budget:
        return None
    return 1.0 / hold_window_s(config, config.admission_budget)


class Scheduler:
    """Keeps the waiting queue (FIFO) and decides each step's work.

    Invariant: a stream id is in ``waiting`` iff its request is WAITING; admission is bounded by
    ``num_free_slots`` passed in by the engine, which owns the slot pool.

    Admission order (``streaming_cohort_admit``): off, oldest first. On, the
    waiting streams are length-sorted, shortest audio received first (ties oldest first):
    shortest-first minimises the mean wait, and it puts live speakers, who have only what they
    said while waiting, before bulk uploads. It is bounded by ``max_wait_time_s``: a stream that
    has waited that long would be refused this step, so it goes before every younger one
    (oldest first among them); the sort never costs a stream its admission at its deadline.
    """

    def __init__(self, config: EngineConfig, feature_frame_s: float = 0.01) -> None:
        self.config = config
        self.feature_frame_s = feature_frame_s  # seconds of audio per feature frame
        self.waiting: collections.deque[int] = collections.deque()

    def add(self, request: Request) -> None:
        self.waiting.append(request.stream_id)

    def remove(self, stream_id: int) -> None:
        if stream_id in self.waiting:
            self.waiting.remove(stream_id)

    def schedule(self, requests: dict[int, Request], num_free_slots: int,
                 now: float, busy_share: Callable[[], float] | None = None) -> SchedulerOutput:
        """Decide this step's admissions, refusals, timeouts, finishes and cohort;
        ``num_free_slots``: how many waiting streams may be admitted (slots free, within the
        step's cost budget: `oasr.engine.admission`); ``busy_share``: the engine's recent
        share of time in steps, which scales the batching hold (`hold_s`; asked only when a
        hold could apply; None: no hold)."""
        out = SchedulerOutput()
        self._expire(requests, now, out)
        if num_free_slots > 0 and self.waiting:
            out.admit.extend(self._admission_order(requests, now)[:num_free_slots])
            for stream_id in out.admit:
                self.waiting.remove(stream_id)
        for stream_id in list(self.waiting):
            if now - requests[stream_id].created_at >= self.config.max_wait_time_s:
                self.waiting.remove(stream_id)
                out.refuse.append(stream_id)
        expired = set(out.timed_out) | set(out.abandoned)
        for stream_id, request in requests.items():
            if request.status is not RequestStatus.RUNNING or stream_id in expired:
                continue
            if request.windower.is_window_ready(request.features):
                out.run.append(stream_id)
                if request.ready_since is None:
                    request.ready_since = now
            elif request.windower.is_exhausted(request.features):
                out.finish.append(stream_id)
        hold = self.hold_s(requests, out.run, now, busy_share)
        if hold is not None:
            return replace(out, run=[], hold_s=hold)
        for stream_id in out.run:
            requests[stream_id].ready_since = None
        return out

    def hold_s(self, requests: dict[int, Request], ready: list[int], now: float,
               busy_share: Callable[[], float] | None) -> float | None:
        """How long to hold the ``ready`` streams' chunks for other streams due soon, or None
        to run them now.

        A running stream is due when the audio its next chunk still lacks would arrive (at
        real-time pace) before the oldest ready chunk has waited the window. The window is
        ``batch_window_s`` scaled by the engine's busy share (in full from
        `BUSY_FOR_FULL_WINDOW` up), so an idle engine holds nothing. Independent speakers'
        chunks come due at different moments: without the hold each costs a step of its own,
        the step's fixed cost (the model call's setup, the policy's pass) paid per stream.
        Nothing is held while a ready stream has a backlog (more than one chunk ready): the
        engine has work for the step now.
        """
        if self.config.batch_window_s <= 0.0 or not ready or busy_share is None:
            return None
        if any(requests[s].windower.has_backlog(requests[s].features) for s in ready):
            return None
        window = hold_window_s(self.config, busy_share())
        if window <= 0.0:
            return None
        oldest = min(t for t in (requests[s].ready_since for s in ready) if t is not None)
        left = oldest + window - now
        if left <= 0.0:
            return None
        waiting_for = set(ready)
        for stream_id, request in requests.items():
            if (stream_id in waiting_for or not request.is_running or request.is_suspended
                    or request.input_ended):
                continue
            missing = request.windower.frames_missing(request.features)
            if missing is not None and missing * self.feature_frame_s <= left:
                return left
        return None

    def _admission_order(self, requests: dict[int, Request], now: float) -> list[int]:
        """Waiting stream ids in the order they take free slots (see the class docstring)."""
        if not self.config.streaming_cohort_admit:
            return list(self.waiting)
        deadline = self.config.max_wait_time_s
        due = [sid for sid in self.waiting if now - requests[sid].created_at >= deadline]
        due_set = set(due)
        rest = [sid for sid in self.waiting if sid not in due_set]
        rest.sort(key=lambda sid: requests[sid].num_samples_received)  # stable: ties FIFO
        return due + rest

    def _expire(self, requests: dict[int, Request], now: float, out: SchedulerOutput) -> None:
        cfg = self.config
        for stream_id, request in requests.items():
            if request.is_finished:
                continue
            if request.suspended_until is not None:  # its client is away: no idle rules
                if now >= request.suspended_until:
                    out.abandoned.append(stream_id)
                    self.remove(stream_id)
                continue
            if request.input_ended:
                continue
            # idle: neither audio in nor a chunk decoded (a stream whose backlog the engine is
            # still working through, its socket paused by backpressure, is not idle)
            idle = now - max(request.last_audio_at, request.last_decoded_at, request.created_at)
            message = None
            if idle >= cfg.idle_timeout_s:
                message = f"no audio for {cfg.idle_timeout_s:g} s"
            elif now - request.created_at >= cfg.max_session_s:
                message = f"the session reached its limit of {cfg.max_session_s:g} s"
            else:
                message = starved_message(request, now, cfg)
            if message is not None:
                out.timed_out.append(stream_id)
                out.timeout_messages[stream_id] = message
                self.remove(stream_id)


def starved_message(request: Request, now: float, config: EngineConfig) -> str | None:
    """Whether a running stream fed less than ``min_audio_rate`` of real time over its last
    full ``audio_rate_window_s`` (counted in audio seconds, not bytes or messages); the
    reason for its client when it did, else None. Starts a new window when one is over."""
    if request.status is not RequestStatus.RUNNING or config.min_audio_rate <= 0:
        return None
    window = config.audio_rate_window_s
    if request.rate_window_start is None:
        request.rate_window_start = request.admitted_at
        request.rate_window_samples = request.num_samples_received
    if request.windower.is_window_ready(request.features):
        # audio waits to be decoded: the server is behind, not the client (backpressure may
        # be holding the client's audio back); judge a window that starts once caught up
        request.rate_window_start = now
        request.rate_window_samples = request.num_samples_received
        return None
    if now - request.rate_window_start < window:
        return None
    audio_s = (request.num_samples_received - request.rate_window_samples) / MODEL_SAMPLE_RATE
    if audio_s < config.min_audio_rate * window:
        return (f"{audio_s:.2f} s of audio in the last {window:g} s, under "
                f"{config.min_audio_rate:.0%} of real time: a stream must keep sending audio "
                "to keep its slot")
    request.rate_window_start = now
    request.rate_window_samples = request.num_samples_received
    return None
