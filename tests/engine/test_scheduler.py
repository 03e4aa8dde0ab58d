"""Scheduler admission on its own: FIFO by default; with streaming_cohort_admit
length-sorted, bounded by max_wait_time_s. Waiting requests only (no model, no audio path)."""

from __future__ import annotations

import math

import pytest

from oasr.audio.chunking import ChunkGeometry, ChunkWindower
from oasr.engine import EngineConfig
from oasr.engine.request import Request, RequestStatus
from oasr.engine.scheduler import Scheduler


def waiting(created_at: float, samples: int, stream_id: int) -> Request:
    request = Request(stream_id=stream_id, sink=lambda event: None, created_at=created_at,
                      features=None, windower=None)  # type: ignore[arg-type]
    request.num_samples_received = samples
    request.last_audio_at = created_at
    return request


def queue(config: EngineConfig, specs: list[tuple[float, int]]) -> tuple[Scheduler, dict]:
    """Streams 1, 2, ... created at the given times with the given audio received."""
    scheduler = Scheduler(config)
    requests = {}
    for sid, (created, samples) in enumerate(specs, start=1):
        requests[sid] = waiting(created, samples, sid)
        scheduler.add(requests[sid])
    return scheduler, requests


SPECS = [(0.0, 48_000), (0.1, 1_600), (0.2, 320_000), (0.3, 8_000)]


def test_default_admits_oldest_first() -> None:
    scheduler, requests = queue(EngineConfig(max_wait_time_s=5.0), SPECS)
    out = scheduler.schedule(requests, num_free_slots=2, now=1.0)
    assert out.admit == [1, 2] and list(scheduler.waiting) == [3, 4]


def test_cohort_admit_takes_the_shortest_first() -> None:
    config = EngineConfig(max_wait_time_s=5.0, streaming_cohort_admit=True)
    scheduler, requests = queue(config, SPECS)
    out = scheduler.schedule(requests, num_free_slots=2, now=1.0)
    assert out.admit == [2, 4] and out.refuse == []
    assert list(scheduler.waiting) == [1, 3]  # still in arrival order
    out = scheduler.schedule(requests, num_free_slots=1, now=1.5)
    assert out.admit == [1] and list(scheduler.waiting) == [3]


def test_cohort_admit_ties_keep_arrival_order() -> None:
    config = EngineConfig(max_wait_time_s=5.0, streaming_cohort_admit=True)
    scheduler, requests = queue(config, [(0.0, 800), (0.1, 800), (0.2, 0), (0.3, 800)])
    assert scheduler.schedule(requests, num_free_slots=3, now=1.0).admit == [3, 1, 2]


def test_a_stream_at_its_deadline_goes_before_shorter_ones() -> None:
    """The sort is bounded by max_wait_time_s: the long upload that has waited 2 s is due
    (it would be refused this step), so it takes the one free slot."""
    config = EngineConfig(max_wait_time_s=2.0, streaming_cohort_admit=True)
    scheduler, requests = queue(config, [(0.0, 320_000), (1.0, 1_600), (1.5, 800)])
    out = scheduler.schedule(requests, num_free_slots=1, now=1.9)
    assert out.admit == [3] and out.refuse == []
    out = scheduler.schedule(requests, num_free_slots=1, now=2.0)
    assert out.admit == [1] and out.refuse == []  # due: before stream 2's shorter audio
    out = scheduler.schedule(requests, num_free_slots=0, now=3.0)
    assert out.admit == [] and out.refuse == [2]


def test_several_due_streams_go_oldest_first() -> None:
    config = EngineConfig(max_wait_time_s=1.0, streaming_cohort_admit=True)
    scheduler, requests = queue(config, [(0.0, 9_000), (0.2, 5_000), (0.4, 100), (1.4, 10)])
    out = scheduler.schedule(requests, num_free_slots=2, now=1.45)
    assert out.admit == [1, 2]
    assert out.refuse == [3] and list(scheduler.waiting) == [4]  # 3 was due too: no slot


@pytest.mark.parametrize("cohort", [False, True])
def test_no_free_slot_admits_nothing(cohort: bool) -> None:
    config = EngineConfig(max_wait_time_s=math.inf, streaming_cohort_admit=cohort)
    scheduler, requests = queue(config, SPECS)
    out = scheduler.schedule(requests, num_free_slots=0, now=20.0)
    assert out.admit == [] and out.refuse == [] and len(scheduler.waiting) == 4


@pytest.mark.parametrize("cohort, order", [(False, [1, 2, 3]), (True, [2, 3, 1])])
def test_engine_admits_in_the_scheduler_order(engine_config: EngineConfig, speech: list,
                                              cohort: bool, order: list[int]) -> None:
    """One slot, three streams queued in the same step: the step each gets READY in."""
    from dataclasses import replace

    from engine_helpers import Collector

    from oasr.engine import ASREngine, Ready
    from oasr.engine.commands import AppendAudio, EndStream, OpenStream

    engine = ASREngine(replace(engine_config, max_batch_size=1,
                               streaming_cohort_admit=cohort))
    events = Collector()
    lengths = {1: 48_000, 2: 8_000, 3: 16_000}
    for sid, n in lengths.items():
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[2][:n]))
        engine.submit(EndStream(sid))
    ready_at: dict[int, int] = {}
    for step in range(10_000):
        engine.step()
        for sid in lengths:
            if sid not in ready_at and events.of_type(sid, Ready):
                ready_at[sid] = step
        if not engine.requests:
            break
    assert sorted(ready_at, key=ready_at.__getitem__) == order
    assert all(events.done(sid).finish_reason == "stop" for sid in lengths)


# -- the batching hold ------------------------------------------------------------------------

class _Frames:
    """A frame source with ``num_frames_ready`` frames (what the windower reads)."""

    def __init__(self, ready: int, finished: bool = False) -> None:
        self.num_frames_ready = ready
        self.is_finished = finished


GEOMETRY = ChunkGeometry(chunk_size=16, subsampling=4, right_context=6)  # windows of 67 frames
WINDOW = GEOMETRY.window_frames


def running(stream_id: int, frames: int, finished: bool = False) -> Request:
    request = Request(stream_id=stream_id, sink=lambda event: None, created_at=0.0,
                      features=_Frames(frames, finished),  # type: ignore[arg-type]
                      windower=ChunkWindower(GEOMETRY))
    request.status = RequestStatus.RUNNING
    request.last_audio_at = request.last_decoded_at = 9.9
    return request


def fully_busy() -> float:
    """The engine's busy share: all of its time in steps."""
    return 1.0


def hold_config(window_s: float = 0.1) -> EngineConfig:
    return EngineConfig(batch_window_s=window_s, min_audio_rate=0.0)


def test_a_busy_engine_holds_a_ready_chunk_for_a_stream_due_within_the_window() -> None:
    scheduler = Scheduler(hold_config(), feature_frame_s=0.01)
    requests = {1: running(1, WINDOW), 2: running(2, WINDOW - 6)}  # 2 is due in 60 ms
    out = scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy)
    assert out.run == [] and out.hold_s == pytest.approx(0.1)
    requests[2].features.num_frames_ready = WINDOW  # its audio came
    out = scheduler.schedule(requests, 0, now=10.05, busy_share=fully_busy)
    assert out.run == [1, 2] and out.hold_s is None  # one step for both
    assert requests[1].ready_since is None and requests[2].ready_since is None


def test_the_hold_ends_at_the_window_whether_or_not_the_others_came() -> None:
    scheduler = Scheduler(hold_config(), feature_frame_s=0.01)
    requests = {1: running(1, WINDOW), 2: running(2, WINDOW - 3)}  # due in 30 ms
    assert scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy).hold_s == pytest.approx(0.1)
    out = scheduler.schedule(requests, 0, now=10.06, busy_share=fully_busy)
    assert out.hold_s == pytest.approx(0.04)  # counted from when 1 became ready
    out = scheduler.schedule(requests, 0, now=10.1, busy_share=fully_busy)  # 2's audio is late
    assert out.run == [1] and out.hold_s is None
    requests[1].windower.next_start_frame += GEOMETRY.stride_frames  # its chunk was run
    requests[1].features.num_frames_ready += GEOMETRY.stride_frames  # and its next came
    out = scheduler.schedule(requests, 0, now=10.15, busy_share=fully_busy)
    assert out.hold_s == pytest.approx(0.1)  # a new hold from the new ready chunk


@pytest.mark.parametrize(("busy", "missing", "held"), [
    (0.0, 1, False),  # an idle engine holds nothing
    (1.0, 11, False),  # due in 110 ms: past the window
    (0.25, 4, True),  # a quarter busy: half the window (50 ms), 40 ms away
    (0.25, 6, False),  # ... 60 ms away
    (0.9, 9, True),  # from half busy on, the whole window
])
def test_the_window_follows_the_engines_busy_share(busy: float, missing: int,
                                                   held: bool) -> None:
    scheduler = Scheduler(hold_config(), feature_frame_s=0.01)
    requests = {1: running(1, WINDOW), 2: running(2, WINDOW - missing)}
    out = scheduler.schedule(requests, 0, now=10.0, busy_share=lambda: busy)
    assert (out.hold_s is not None) is held and (out.run == []) is held


def test_streams_that_will_not_send_more_are_not_waited_for() -> None:
    scheduler = Scheduler(hold_config(), feature_frame_s=0.01)
    ended = running(2, WINDOW - 2)
    ended.input_ended = True
    finished_input = running(3, WINDOW - 2, finished=True)  # its last, short chunk is ready
    away = running(4, WINDOW - 2)
    away.suspended_until = 20.0
    requests = {1: running(1, WINDOW), 2: ended, 3: finished_input, 4: away}
    out = scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy)
    assert out.run == [1, 3] and out.hold_s is None


def test_a_stream_with_a_backlog_is_not_held() -> None:
    """Audio that came faster than it was decoded (an upload, a stall caught up): the step
    has work now, so nothing waits for a stream due."""
    scheduler = Scheduler(hold_config(), feature_frame_s=0.01)
    requests = {1: running(1, WINDOW + GEOMETRY.stride_frames), 2: running(2, WINDOW - 2)}
    out = scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy)
    assert out.run == [1] and out.hold_s is None
    requests[1].features.num_frames_ready -= 1  # one chunk ready, not two: held
    assert scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy).hold_s is not None


def test_no_window_no_hold() -> None:
    scheduler = Scheduler(hold_config(0.0), feature_frame_s=0.01)
    requests = {1: running(1, WINDOW), 2: running(2, WINDOW - 1)}
    assert scheduler.schedule(requests, 0, now=10.0, busy_share=fully_busy).run == [1]
