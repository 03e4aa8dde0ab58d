"""The second pass is shared by stream, not by arrival: a stream sending faster than real time
cannot take a live speaker's finals, nor most of the backlog from another fast stream.

- `SecondPassWorker.try_submit`: a full backlog makes room for a paced stream's final at the
  expense of the fast stream with the most finals queued; between fast streams, only from one
  with at least two more queued.
- `SecondPassLoop`: a fast stream's final is handed to the decoder only while no final waits
  for a row, and never makes a paced stream's final a fast (greedy) decode.
- `YieldRule`: a fast stream's audio backlog is its own and does not hold the second pass.
"""

from __future__ import annotations

import queue
from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import live_stream
from test_second_pass_worker import ScriptedDecoder, _job, _voice

from oasr.engine.families.base import FrameTiming
from oasr.engine.live.policy import YieldRule
from oasr.engine.live.state import PACE_MARGIN_S, LiveStream
from oasr.engine.second_pass.loop import SecondPassLoop
from oasr.engine.second_pass.worker import SecondPassDone, SecondPassJob, SecondPassWorker

RATE = 16_000


def _final(job_id: int, stream_id: int, paced: bool) -> SecondPassJob:
    return replace(_job(job_id, _voice(0.3)), stream_id=stream_id, paced=paced)


def _full_worker(max_backlog: int, jobs: list[SecondPassJob]
                 ) -> tuple[SecondPassWorker, queue.Queue[SecondPassDone]]:
    """A worker whose decoder never finishes (nothing released), its backlog filled."""
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(ScriptedDecoder({}), out.put, max_backlog=max_backlog)
    for job in jobs:
        assert worker.try_submit(job)
    assert worker.backlog == max_backlog
    return worker, out


def test_a_paced_final_takes_the_place_of_the_fastest_streams_newest() -> None:
    fast = [_final(i, stream_id=7, paced=False) for i in (1, 2, 3)]
    worker, out = _full_worker(4, [*fast, _final(4, stream_id=8, paced=False)])
    assert worker.try_submit(_final(5, stream_id=1, paced=True))
    evicted = out.get(timeout=5)
    assert (evicted.job_id, evicted.stream_id, evicted.text, evicted.source) == (3, 7, None, "ctc")
    assert worker.num_evicted == 1 and worker.backlog == 4
    worker.stop()


def test_a_full_backlog_of_paced_finals_refuses_another() -> None:
    worker, out = _full_worker(2, [_final(1, 1, True), _final(2, 2, True)])
    assert not worker.try_submit(_final(3, 3, True))
    assert not worker.try_submit(_final(4, 4, False))
    assert worker.num_evicted == 0
    with pytest.raises(queue.Empty):
        out.get(timeout=0.1)
    worker.stop()


def test_fast_streams_share_a_full_backlog_evenly() -> None:
    worker, out = _full_worker(4, [_final(i, stream_id=7, paced=False) for i in (1, 2, 3, 4)])
    # stream 9 comes with nothing queued: it takes places from 7 until they hold 2 each
    assert worker.try_submit(_final(5, stream_id=9, paced=False))  # 7: 4 queued, 9: 0
    assert worker.try_submit(_final(6, stream_id=9, paced=False))  # 7: 3, 9: 1
    assert not worker.try_submit(_final(7, stream_id=9, paced=False))  # 7: 2, 9: 2
    assert [out.get(timeout=5).job_id for _ in range(2)] == [4, 3]  # 7's newest first
    assert not worker.try_submit(_final(8, stream_id=7, paced=False))  # none from itself
    assert worker.num_evicted == 2
    worker.stop()


class _RowDecoder(ScriptedDecoder):
    """Counts the requests waiting for a row, as Whisper's continuous decoder does
    (``num_urgent``); ``run_all`` takes them into rows."""

    def __init__(self) -> None:
        super().__init__({})
        self.order: list[int] = []
        self.waiting: list[int] = []

    @property
    def num_urgent(self) -> int:
        return len(self.waiting)

    def submit(self, job_id: int, audio: np.ndarray, prefix: tuple[int, ...] = (),
               background: bool = False, fast: bool = False,
               draft: tuple[int, ...] = ()) -> None:
        super().submit(job_id, audio, prefix, background, fast, draft)
        self.order.append(job_id)
        self.waiting.append(job_id)

    def run_all(self) -> None:
        self.waiting.clear()


def _take(loop: SecondPassLoop, jobs: list[SecondPassJob]) -> None:
    commands: queue.SimpleQueue[SecondPassJob] = queue.SimpleQueue()
    for job in jobs:
        commands.put(job)
    assert loop._take_commands(lambda block: commands.get(block), False)


def test_a_fast_streams_finals_wait_while_a_paced_final_waits_for_a_row() -> None:
    decoder = _RowDecoder()
    loop = SecondPassLoop(decoder, lambda answer: None, fast_backlog=1)
    _take(loop, [_final(1, 7, False), _final(2, 7, False), _final(3, 1, True)])
    # the first fast final went in at once (nothing waited); the paced one behind at most it
    assert decoder.order == [1, 3]
    assert not decoder.fast[3]  # the fast stream's queued final does not make it greedy
    decoder.run_all()
    loop._release_unpaced()
    assert decoder.order == [1, 3, 2]
    assert decoder.fast[2]  # the fast stream's: decoded fast behind a backlog


def test_an_aborted_fast_final_leaves_the_queue() -> None:
    decoder = _RowDecoder()
    loop = SecondPassLoop(decoder, lambda answer: None)
    _take(loop, [_final(1, 7, False), _final(2, 7, False), _final(3, 7, False)])
    commands: queue.SimpleQueue[int] = queue.SimpleQueue()
    commands.put(2)
    assert loop._take_commands(lambda block: commands.get(block), False)
    decoder.run_all()
    loop._release_unpaced()
    decoder.run_all()
    loop._release_unpaced()
    assert decoder.order == [1, 3]


def _stream(received_s: float, decoded_frames: int, first_audio_at: float) -> LiveStream:
    stream = live_stream()
    stream.view.status = stream.view.status.RUNNING  # type: ignore[attr-defined]
    stream.view.num_samples_received = int(received_s * RATE)  # type: ignore[misc]
    stream.view.num_frames_decoded = decoded_frames  # type: ignore[misc]
    stream.first_audio_at = first_audio_at
    return stream


def test_a_stream_sending_faster_than_real_time_is_not_paced() -> None:
    assert _stream(10.0, 0, first_audio_at=100.0).is_paced(now=110.0)
    assert _stream(10.0 + PACE_MARGIN_S, 0, first_audio_at=100.0).is_paced(now=110.0)
    assert not _stream(13.0, 0, first_audio_at=100.0).is_paced(now=110.0)
    assert live_stream().is_paced(now=0.0)  # no audio yet


def test_only_a_paced_streams_backlog_holds_the_second_pass() -> None:
    rule = YieldRule.of(0.25, 32, FrameTiming(frame_shift_s=0.02, right_context_samples=40))
    assert rule is not None
    # 60 s received in 20 s of wall time, 10 s decoded: far behind, but by its own doing
    fast = _stream(60.0, 500, first_audio_at=100.0)
    assert not rule.is_behind([fast], now=120.0)
    # a live speaker 3 s behind: the step is behind real time
    live = _stream(20.0, 850, first_audio_at=100.0)
    assert rule.is_behind([fast, live], now=120.0)
    on_time = _stream(20.0, 990, first_audio_at=100.0)
    assert not rule.is_behind([fast, on_time], now=120.0)
