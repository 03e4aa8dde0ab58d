"""Clients sending at full speed do not cost a live speaker the second pass.

The scenario of a loaded server, at the live-text policy's level: four streams sending far
faster than real time fill the second pass's backlog with their segments' finals; a stream
at real-time pace then ends its segments. Each of its finals must still be queued for Whisper
(not published with its CTC text for a full backlog), at the fast streams' expense, and the
fast streams share what is left of the backlog.
"""

from __future__ import annotations

import queue

import numpy as np

from oasr.audio import ChunkGeometry
from oasr.decoding import Hypothesis
from oasr.engine.events import Final, StreamEvent
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.finals import FinalPublisher
from oasr.engine.live.policy import LivePolicy
from oasr.engine.live.segment_cuts import SegmentCuts
from oasr.engine.request import Request, RequestStatus
from oasr.engine.second_pass.worker import SecondPassWorker

RATE = 16_000
TIMING = FrameTiming(frame_shift_s=0.02, right_context_samples=0)
SEGMENT_FRAMES = 100  # 2 s segments


class _BusyWhisper:
    """A decoder that never finishes a decode: every final stays in the backlog."""

    max_new_tokens = 100

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def submit(self, job_id: int, audio: np.ndarray, **kwargs: object) -> None:
        self.submitted.append(job_id)

    def has_work(self) -> bool:
        return False

    def step(self) -> list[object]:
        return []

    def abort(self, job_id: int) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _open(policy: LivePolicy, stream_id: int, events: list[StreamEvent]) -> Request:
    request = Request(stream_id, events.append, 0.0, None, None)  # type: ignore[arg-type]
    request.transition(RequestStatus.RUNNING)
    policy.open(request)
    return request


def _speak(policy: LivePolicy, request: Request, seconds: float, now: float) -> None:
    t = np.arange(int(seconds * RATE)) / RATE
    audio = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    policy.on_audio([(request.stream_id, audio)], now)
    request.num_samples_received += len(audio)


def _end_segment(policy: LivePolicy, request: Request) -> None:
    """What the loop does at an endpoint: the segment's frames decoded, its final, a reset."""
    request.num_frames_decoded += SEGMENT_FRAMES
    hyp = Hypothesis([5, 6], "some words", 0.0, [10, 60])
    policy.end_segment(request.stream_id, hyp, "endpoint", SEGMENT_FRAMES, 5)
    request.segment_start_frame = request.num_frames_decoded


def test_a_live_speakers_finals_go_to_whisper_beside_four_full_speed_clients() -> None:
    clock = _Clock()
    answers: queue.Queue[object] = queue.Queue()
    worker = SecondPassWorker.on_thread(_BusyWhisper(), answers.put, max_backlog=4, clock=clock)
    finals = FinalPublisher(worker, TIMING, clock=clock)
    policy = LivePolicy(finals, None, SegmentCuts(None, ChunkGeometry(chunk_size=32)), TIMING, 32)
    events: list[StreamEvent] = []
    fast = [_open(policy, stream_id, events) for stream_id in (2, 3, 4, 5)]
    live = _open(policy, 1, events)
    for request in fast:  # 6 s of audio in no time: far ahead of real time
        _speak(policy, request, 6.0, clock.now)
    _speak(policy, live, 0.1, clock.now)
    for _ in range(2):  # two segments each: eight finals for a backlog of four
        for request in fast:
            _end_segment(policy, request)
    assert worker.backlog == 4
    for _ in range(3):  # the live speaker: 2 s of audio, 2 s of wall time, one segment
        clock.now += 2.0
        _speak(policy, live, 2.0, clock.now)
        _end_segment(policy, live)
    while not answers.empty():  # the fast finals whose places were taken: the engine's mail
        policy.on_second_pass(answers.get())  # type: ignore[arg-type]
    live_stream = policy.streams[1]
    assert len(live_stream.pending_finals) == 3  # all three wait for Whisper
    assert all(not p.answered for p in live_stream.pending_finals.values())
    assert not [e for e in events if isinstance(e, Final) and e.stream_id == 1]
    assert finals.num_backlog_full == 4  # fast finals that found no place: theirs alone
    assert worker.num_evicted == 3 and worker.backlog == 4
    # what the fast streams keep queued is shared: none holds more than one more than another
    queued = [sum(not p.answered for p in policy.streams[r.stream_id].pending_finals.values())
              for r in fast]
    assert max(queued) - min(queued) <= 1, queued
    worker.stop()
