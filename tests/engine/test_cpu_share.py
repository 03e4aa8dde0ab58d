"""The second pass's CPU share follows the engine's load (`CpuShare`).

- With a process of its own, the second pass decodes on all the engine's threads (up to 8)
  while at most ``max_streams`` streams are live, and on its budget (half) above that; on a
  thread of the engine's process, or with a fixed count, the count never moves.
- The decoding side applies a `ThreadBudget` to the thread that decodes, before its next
  decoder step, and reports it (``SecondPassWorker.threads``); the worker sends a count only
  when it changes.
- The engine asks for the share its live streams call for on every step.
"""

from __future__ import annotations

import queue
import time
from dataclasses import replace

import pytest
import torch
from test_second_pass_hold import HoldRecorder
from test_second_pass_worker import ScriptedDecoder, _job, _voice

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import OpenStream
from oasr.engine.second_pass import CpuShare, SecondPassDone, SecondPassWorker


def test_a_process_decodes_on_every_thread_only_at_a_demos_load() -> None:
    share = CpuShare.of(None, engine_threads=2, in_process=True, max_streams=2)
    assert [share.threads(n) for n in (0, 1, 2, 3, 64)] == [2, 2, 2, 1, 1]
    big = CpuShare.of(None, engine_threads=16, in_process=True, max_streams=2)
    assert (big.threads(1), big.threads(3)) == (8, 4)
    on_thread = CpuShare.of(None, engine_threads=2, in_process=False, max_streams=2)
    assert {on_thread.threads(n) for n in (1, 3)} == {1}
    fixed = CpuShare.of(3, engine_threads=2, in_process=True, max_streams=2)
    assert {fixed.threads(n) for n in (1, 3)} == {3}


class ThreadCountingDecoder(ScriptedDecoder):
    """Records the torch thread count of the thread that runs each decoder step."""

    def __init__(self, scripts: dict[int, str]) -> None:
        super().__init__(scripts)
        self.step_threads: list[int] = []

    def step(self) -> list[object]:
        self.step_threads.append(torch.get_num_threads())
        return super().step()


class CountingPuts:
    """Wraps a runner's ``put`` to count the thread budgets sent."""

    def __init__(self, worker: SecondPassWorker) -> None:
        self.budgets = 0
        runner = worker._runner
        put = runner.put

        def counted(command: object) -> None:
            self.budgets += type(command).__name__ == "ThreadBudget"
            put(command)  # type: ignore[arg-type]

        runner.put = counted  # type: ignore[method-assign]


def _decode(worker: SecondPassWorker, decoder: ThreadCountingDecoder,
            out: queue.Queue[SecondPassDone], job_id: int) -> int:
    """Submit and release one job; the thread count its last decoder step ran with."""
    decoder.release(job_id)
    assert worker.try_submit(_job(job_id, _voice(0.5)))
    assert out.get(timeout=5).job_id == job_id
    return decoder.step_threads[-1]


def test_the_decoding_side_decodes_with_the_threads_it_is_given() -> None:
    decoder = ThreadCountingDecoder({1: "one", 2: "two", 3: "three"})
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, engine_threads=4)
    puts = CountingPuts(worker)
    try:
        assert _decode(worker, decoder, out, 1) == 2  # the budget: half the engine's 4
        worker.share_cpu(3)
        worker.share_cpu(3)  # no change: nothing sent
        assert _decode(worker, decoder, out, 2) == 3
        assert worker.threads == 3 and puts.budgets == 1
        worker.share_cpu(1)
        assert _decode(worker, decoder, out, 3) == 1
        assert worker.threads == 1 and puts.budgets == 2
    finally:
        worker.stop()


def test_a_thread_budget_does_not_touch_the_engine_threads_count() -> None:
    before = torch.get_num_threads()
    decoder = ThreadCountingDecoder({1: "one"})
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, engine_threads=2)
    try:
        worker.share_cpu(before + 1)
        assert _decode(worker, decoder, out, 1) == before + 1
        assert torch.get_num_threads() == before
    finally:
        worker.stop()


class ShareRecorder(HoldRecorder):
    """Stands in for the worker: records the thread counts the engine asks for."""

    has_process = True

    def __init__(self) -> None:
        super().__init__()
        self.shares: list[int] = []

    def share_cpu(self, threads: int) -> None:
        self.shares.append(threads)


@pytest.mark.parametrize("live, expected", [(1, 2), (2, 2), (3, 1)])
def test_the_engine_asks_for_the_share_its_live_streams_call_for(
        engine_config: EngineConfig, live: int, expected: int) -> None:
    engine = ASREngine(replace(engine_config, early_final_s=0.0))
    recorder = ShareRecorder()
    engine.finals.worker = recorder  # type: ignore[assignment]
    engine._cpu_share = CpuShare(budget=1, full=2, max_streams=2)
    for stream_id in range(live):
        engine.submit(OpenStream(stream_id, lambda event: None))
    deadline = time.monotonic() + 5
    while len(engine.requests) < live and time.monotonic() < deadline:
        engine.step()
    engine.step()
    assert len(engine.requests) == live and recorder.shares[-1] == expected
