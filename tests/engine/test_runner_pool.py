"""Several second-pass processes as one decoding side (``RunnerPool``,
``EngineConfig.second_pass_processes``).

- A job goes to the runner with the fewest jobs outstanding; a final whose context job is
  still outstanding goes to that job's runner (the context's text is only known there); an
  abort goes to the runner that has the job, and nowhere once it was answered.
- Holds and stops reach every runner; the counters are their sums.
- A runner that is lost fails only the jobs it held and gets no more; the pool is lost with
  its last runner.
- With real child processes: both decode, and one that dies fails only its own jobs while the
  other goes on decoding.
"""

from __future__ import annotations

import itertools
import os
import queue
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
from test_second_pass_hold import child_scripted
from test_second_pass_worker import _job, _voice

from oasr.engine.second_pass.jobs import Answer, RefineJob, SecondPassJob
from oasr.engine.second_pass.loop import Command, LoopCounters
from oasr.engine.second_pass.process import ProcessRunner, WhisperProcessSpec
from oasr.engine.second_pass.worker import RunnerPool, SecondPassDone, SecondPassWorker

RATE = 16_000


class _Runner:
    """Records what it is given; ``answer(job_id)`` answers one of its jobs."""

    num_decoders = 1

    def __init__(self, answered: Any, counters: LoopCounters, lost: Any = None) -> None:
        self.answered = answered
        self.lost = lost
        self.counters = counters
        self.commands: list[Command] = []
        self.holds: list[bool] = []
        self.stopped = False

    def put(self, command: Command) -> None:
        self.commands.append(command)

    def hold(self, held: bool) -> None:
        self.holds.append(held)

    def stop(self, timeout: float) -> None:
        self.stopped = True

    def answer(self, job_id: int) -> None:
        self.answered(SecondPassDone(job_id, 1, "text", 0.1))

    @property
    def job_ids(self) -> list[int]:
        return [c.job_id for c in self.commands if isinstance(c, SecondPassJob | RefineJob)]


def _pool(num: int = 2, lost: Any = None) -> tuple[RunnerPool, list[_Runner], list[Answer]]:
    runners: list[_Runner] = []
    answers: list[Answer] = []

    def start_one(answered: Any, lost_one: Any) -> _Runner:
        runners.append(_Runner(answered, LoopCounters(num_refinements=len(runners) + 1,
                                                       busy_seconds=0.5), lost_one))
        return runners[-1]

    return RunnerPool(start_one, num, answers.append, lost or print), runners, answers


def _refine(job_id: int) -> RefineJob:
    return RefineJob(job_id, 1, 0, np.zeros(RATE, np.float32), (), 50)


def test_a_job_goes_to_the_runner_with_the_fewest_outstanding() -> None:
    pool, (a, b), answers = _pool()
    for job_id in (1, 2, 3):
        pool.put(_job(job_id, _voice(0.5)))
    assert (a.job_ids, b.job_ids) == ([1, 3], [2])
    b.answer(2)  # b is idle again, a still has two
    pool.put(_refine(4))
    pool.put(_job(5, _voice(0.5)))
    assert (a.job_ids, b.job_ids) == ([1, 3], [2, 4, 5])
    assert [x.job_id for x in answers] == [2]


def test_a_final_follows_its_context_job() -> None:
    pool, (a, b), _ = _pool()
    pool.put(_job(1, _voice(0.5)))
    pool.put(_job(2, _voice(0.5)))
    pool.put(_job(3, _voice(0.5)))  # a: 1, 3; b: 2
    waiting = SecondPassJob(4, 1, 1, _voice(0.5), 0.0, context_job=3)
    pool.put(waiting)  # b has fewer, but job 3's text will only be known on a
    assert a.job_ids == [1, 3, 4]
    a.answer(3)
    pool.put(SecondPassJob(5, 1, 2, _voice(0.5), 0.0, context_job=3))  # 3 is out: anywhere
    assert b.job_ids == [2, 5]


def test_aborts_holds_stops_and_counters() -> None:
    pool, (a, b), _ = _pool()
    pool.put(_job(1, _voice(0.5)))
    pool.put(_job(2, _voice(0.5)))
    pool.put(2)
    assert b.commands[-1] == 2 and 2 not in a.commands  # to the runner that had it
    b.answer(1)  # (a stray answer for a job b never had changes nothing)
    a.answer(1)
    pool.put(1)  # answered already: nowhere
    assert a.commands[-1] != 1
    pool.put(_job(3, _voice(0.5)))
    assert a.job_ids == [1, 3]  # both idle again: the first
    pool.hold(True)
    assert a.holds == b.holds == [True]
    assert pool.num_decoders == 2
    assert pool.counters.num_refinements == 3 and pool.counters.busy_seconds == 1.0
    pool.put(None)
    assert a.commands[-1] is None and b.commands[-1] is None
    pool.stop(1.0)
    assert a.stopped and b.stopped
    with pytest.raises(ValueError, match=">= 1 runner"):
        RunnerPool(lambda answered, lost: _Runner(answered, LoopCounters()), 0, print, print)


def test_a_runner_that_fails_to_start_stops_those_started() -> None:
    started: list[_Runner] = []
    calls = itertools.count()

    def start_one(answered: Any, lost: Any) -> _Runner:
        if next(calls) == 1:
            raise ValueError("no weights here")
        started.append(_Runner(answered, LoopCounters()))
        return started[0]

    with pytest.raises(ValueError, match="no weights here"):
        RunnerPool(start_one, 2, print, print)
    assert len(started) == 1 and started[0].stopped


def test_runners_start_together() -> None:
    # each start waits until the other has begun: one after the other, the first never returns
    both = threading.Barrier(2, timeout=10)

    def start_one(answered: Any, lost: Any) -> _Runner:
        both.wait()
        return _Runner(answered, LoopCounters())

    assert RunnerPool(start_one, 2, print, print).num_decoders == 2


def test_a_lost_runner_fails_only_its_jobs_and_the_last_one_loses_the_pool() -> None:
    lost_pool: list[bool] = []
    pool, (a, b), answers = _pool(lost=lambda: lost_pool.append(True))
    pool.put(_job(1, _voice(0.5)))
    pool.put(_refine(2))
    pool.put(_job(3, _voice(0.5)))  # a: 1, 3; b: 2
    a.lost()
    assert sorted((x.job_id, type(x).__name__) for x in answers) == [
        (1, "SecondPassDone"), (3, "SecondPassDone")]
    assert all(x.text is None and x.source == "ctc" for x in answers)
    assert pool.num_decoders == 1 and not lost_pool
    a.answer(1)  # a late answer from the lost runner is passed on, the pool's books unchanged
    pool.put(_job(4, _voice(0.5)))
    pool.put(SecondPassJob(5, 1, 1, _voice(0.5), 0.0, context_job=3))  # 3 failed: anywhere
    assert (a.job_ids, b.job_ids) == ([1, 3], [2, 4, 5])
    pool.put(3)  # an abort for a failed job goes nowhere
    assert 3 not in a.commands
    b.lost()
    assert lost_pool == [True]  # the pool's owner answers the rest
    assert pool.num_decoders == 0
    pool.put(_job(6, _voice(0.5)))
    assert 6 not in a.job_ids + b.job_ids


def _two_processes() -> tuple[SecondPassWorker, queue.Queue[Any]]:
    out: queue.Queue[Any] = queue.Queue()

    def start(answered: Any, lost: Any) -> Any:
        return RunnerPool(lambda one, lost_one: ProcessRunner(
            WhisperProcessSpec(nice=5), one, lost_one, target=child_scripted), 2, answered, lost)

    return SecondPassWorker(out.put, 8, start), out


def test_two_processes_decode_side_by_side() -> None:
    worker, out = _two_processes()
    assert worker.num_decoders == 2
    quiet = np.zeros(RATE, dtype=np.float32)
    assert worker.try_submit(_job(1, _voice(0.5)))  # the first child: scripted, released
    assert worker.try_submit(_job(3, quiet))  # the second: no voice, answered ""
    answers = {}
    for _ in range(2):
        done = out.get(timeout=30)
        answers[done.job_id] = done.text
    assert answers == {1: "from the child", 3: ""}
    deadline = time.monotonic() + 5
    while worker.num_no_voice != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.num_no_voice == 1 and worker.backlog == 0
    processes = [r.process for r in worker._runner.runners]  # type: ignore[attr-defined]
    assert len({p.pid for p in processes}) == 2
    worker.stop()
    assert not any(p.is_alive() for p in processes)


def test_one_process_dying_fails_its_own_jobs_and_the_other_goes_on() -> None:
    worker, out = _two_processes()
    assert worker.try_submit(_job(2, _voice(0.5)))  # scripted, never released: first child
    assert worker.try_submit(_job(4, _voice(0.5)))  # never answered: the second child
    first, second = (r.process for r in worker._runner.runners)  # type: ignore[attr-defined]
    os.kill(first.pid, signal.SIGKILL)
    done = out.get(timeout=10)
    assert (done.job_id, done.text, done.source) == (2, None, "ctc")  # kept its CTC text
    assert worker.num_decoders == 1 and worker.backlog == 1  # job 4 still on the second
    assert worker.try_submit(_job(1, _voice(0.5)))  # to the second child, which answers it
    done = out.get(timeout=30)
    assert (done.job_id, done.text) == (1, "from the child")
    assert out.empty()
    os.kill(second.pid, signal.SIGKILL)
    done = out.get(timeout=10)
    assert (done.job_id, done.text, done.source) == (4, None, "ctc")
    assert not worker.try_submit(_job(6, _voice(0.5)))  # both gone: the second pass is lost
    worker.stop(timeout=2)


def _server_stand_in(pids: Any) -> None:
    """A server's stand-in: starts one second-pass child, says its pid, and waits to be
    killed."""
    runner = ProcessRunner(WhisperProcessSpec(nice=5), lambda answer: None, lambda: None,
                           target=child_scripted)
    pids.put(runner.process.pid)
    time.sleep(600)


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie: exited
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_child_whose_server_is_killed_exits() -> None:
    """The server killed (SIGKILL: no stop command, its queues never closed): its second-pass
    child does not live on holding Whisper's memory, it exits within seconds."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pids = ctx.Queue()
    server = ctx.Process(target=_server_stand_in, args=(pids,))
    server.start()
    child = pids.get(timeout=60)
    time.sleep(1.5)
    assert not _exited(child)  # alive while its server is
    os.kill(server.pid, signal.SIGKILL)
    server.join(10)
    deadline = time.monotonic() + 15
    while not _exited(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exited(child)
