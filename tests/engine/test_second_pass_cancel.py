"""An aborted job stops a long decoder step midway (an early final the speaker went on from).

A beam decode is one long decoder step; the loop hands the decoder ``is_aborted`` as its
``cancelled`` and takes the commands that arrive meanwhile, so a decode whose every request
was aborted is given up at its next token instead of running to its end, and what came during
the step (the abort itself, new jobs) is handled after it, in order. On a thread of the
engine's process and in a process of its own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_second_pass_hold import _in_process
from test_second_pass_worker import ScriptedDecoder, _job, _voice

from oasr.engine.second_pass.process import WhisperProcessSpec, child_main
from oasr.engine.second_pass.worker import SecondPassDone, SecondPassWorker

LONG_DECODE_S = 10.0


class LongDecoder(ScriptedDecoder):
    """A step with an unreleased job in it runs for ``LONG_DECODE_S`` (one long beam decode),
    asking ``cancelled`` between its "tokens"; a job released meanwhile decodes at once."""

    def __init__(self, scripts: dict[int, str]) -> None:
        super().__init__(scripts)
        self.cancelled: Callable[[int], bool] = lambda job_id: False  # the loop sets it
        self.num_cancelled = 0
        self.aborted: list[int] = []
        self.in_long_step = threading.Event()  # set when a long step begins (this process)

    def step(self) -> list[object]:
        with self._lock:
            long = [j for j in self._pending if j not in self.released]
        deadline = time.monotonic() + LONG_DECODE_S
        if long:
            self.in_long_step.set()
        while long and time.monotonic() < deadline:
            if all(self.cancelled(j) for j in long):
                self.num_cancelled += 1
                for job_id in long:
                    self._pending.remove(job_id)
                break
            time.sleep(0.01)
        return super().step()

    def abort(self, job_id: int) -> bool:
        self.aborted.append(job_id)
        return super().abort(job_id)


def _long(spec: WhisperProcessSpec) -> object:
    decoder = LongDecoder({1: "said before the speaker went on", 2: "the next segment"})
    decoder.release(2)
    return decoder


def child_long(spec: WhisperProcessSpec, commands: Any, answers: Any, may_step: Any) -> None:
    child_main(spec, commands, answers, may_step, _long)


def _abort_the_long_decode(worker: SecondPassWorker, out: queue.Queue[SecondPassDone],
                           in_long_step: Callable[[], bool]) -> None:
    """Job 1 decodes long; abort it once its long step began (``in_long_step`` waits for
    that), submit job 2: 2 is answered long before the long step would have ended."""
    assert worker.try_submit(_job(1, _voice(0.5)))
    assert in_long_step(), "the long step did not begin"
    worker.abort(1)
    assert worker.try_submit(_job(2, _voice(0.5)))
    done = out.get(timeout=LONG_DECODE_S / 2)  # long before the long step would end
    assert (done.job_id, done.text) == (2, "the next segment")


def test_an_aborted_decode_is_given_up_midway_on_a_thread() -> None:
    decoder = _long(WhisperProcessSpec())
    assert isinstance(decoder, LongDecoder)
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8)
    assert decoder.cancelled(1) is False  # set by the loop: nothing aborted yet
    _abort_the_long_decode(worker, out, lambda: decoder.in_long_step.wait(5))
    assert decoder.num_cancelled == 1
    assert decoder.aborted == [1]  # the abort taken during the step is still handled after it
    assert decoder.submitted.keys() == {1, 2}
    with pytest.raises(queue.Empty):
        out.get(timeout=0.3)  # no answer for the job given up
    assert worker.backlog == 0 and worker.counters.num_cancelled == 1
    worker.stop()


def test_an_aborted_decode_is_given_up_midway_in_a_process() -> None:
    worker, out = _in_process(child_long)
    # the child's decoder is spawned, out of reach of an event: the long step has begun
    # once the child has taken the job and half a second has passed
    _abort_the_long_decode(worker, out, lambda: time.sleep(0.5) is None)
    deadline = time.monotonic() + 5
    while worker.counters.num_cancelled != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.counters.num_cancelled == 1 and worker.backlog == 0
    worker.stop()


def test_a_stop_during_a_long_decode_ends_it() -> None:
    decoder = _long(WhisperProcessSpec())
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8)
    assert worker.try_submit(_job(1, _voice(0.5)))
    assert decoder.in_long_step.wait(5)
    started = time.monotonic()
    worker.stop(timeout=LONG_DECODE_S)
    assert time.monotonic() - started < LONG_DECODE_S / 2
    assert not worker._runner._thread.is_alive()  # type: ignore[attr-defined]
