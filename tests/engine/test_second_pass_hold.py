"""The second pass yields to the streaming step, and can run in a process of its own.

- While the engine holds it (a live stream is behind real time), the decoding side takes
  commands but runs no decoder step; a final queued ``SECOND_PASS_MAX_HOLD_S`` ago is answered
  with its CTC text (``num_expired``), however briefly it was held; ``held_seconds`` counts
  the time held, all holds together.
- The engine holds it exactly while some live stream has more than a chunk plus
  ``second_pass_yield_s`` of audio waiting, and never with ``second_pass_yield_s=None``.
- In a process (``SecondPassWorker.in_process``) answers and counters come back through the
  reader; a child that dies answers everything outstanding as failed and takes no more jobs;
  a child that cannot build its decoder is refused with its reason.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from engine_helpers import FakeClock
from test_second_pass_worker import ScriptedDecoder, _job, _voice

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, OpenStream
from oasr.engine.second_pass.process import WhisperProcessSpec, child_main
from oasr.engine.second_pass.worker import SECOND_PASS_MAX_HOLD_S, SecondPassDone, SecondPassWorker

RATE = 16_000


class CountingDecoder(ScriptedDecoder):
    def __init__(self, scripts: dict[int, str]) -> None:
        super().__init__(scripts)
        self.num_steps = 0
        self.aborted: list[int] = []

    def step(self) -> list[object]:
        self.num_steps += 1
        return super().step()

    def abort(self, job_id: int) -> bool:
        self.aborted.append(job_id)
        return super().abort(job_id)


def test_a_held_worker_takes_jobs_but_does_not_step() -> None:
    decoder = CountingDecoder({1: "one", 2: "two"})
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8)
    worker.hold(True)
    decoder.release(1)
    assert worker.try_submit(_job(1, _voice(0.5)))
    deadline = time.monotonic() + 5
    while 1 not in decoder.submitted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 1 in decoder.submitted and decoder.num_steps == 0  # taken, not decoded
    with pytest.raises(queue.Empty):
        out.get(timeout=0.1)
    worker.hold(False)
    assert out.get(timeout=5).text == "one"
    worker.stop()
    assert worker.num_holds == 1 and worker.num_expired == 0 and worker.backlog == 0


def test_a_final_held_too_long_keeps_its_ctc_text(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = CountingDecoder({1: "one", 2: "two"})
    out: queue.Queue[SecondPassDone] = queue.Queue()
    clock = FakeClock()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, clock=clock)
    worker.hold(True)
    assert worker.try_submit(replace(_job(1, _voice(0.5)), submitted_at=clock()))
    clock.advance(SECOND_PASS_MAX_HOLD_S - 1)
    assert worker.try_submit(replace(_job(2, _voice(0.5)), submitted_at=clock()))
    worker.hold(True)  # held again after the next step, before job 1 has waited its limit
    with pytest.raises(queue.Empty):
        out.get(timeout=0.1)
    clock.advance(2)  # job 1 has waited past the limit, job 2 has not
    worker.hold(True)
    expired = out.get(timeout=5)
    assert (expired.job_id, expired.text, expired.source) == (1, None, "ctc")
    assert worker.num_expired == 1 and worker.backlog == 1  # job 2 still waits
    decoder.release(1)
    decoder.release(2)
    worker.hold(False)
    assert out.get(timeout=5).job_id == 2  # job 1 was aborted on the decoding side
    worker.stop()
    with pytest.raises(queue.Empty):
        out.get(timeout=0.2)
    assert 1 in decoder.aborted


def test_a_brief_hold_gives_up_an_old_final_and_the_time_held_is_counted() -> None:
    """The limit is the final's age, not its time held (counting only the time held let the
    finals' tail come a second later); the worker counts the time held across holds."""
    decoder = CountingDecoder({1: "one", 2: "two"})
    out: queue.Queue[SecondPassDone] = queue.Queue()
    clock = FakeClock()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, clock=clock)
    worker.hold(True)
    clock.advance(0.5)
    worker.hold(False)
    assert worker.held_seconds == pytest.approx(0.5)
    assert worker.try_submit(replace(_job(1, _voice(0.5)), submitted_at=clock()))
    clock.advance(SECOND_PASS_MAX_HOLD_S + 1)  # decoding (slowly), not held
    assert worker.held_seconds == pytest.approx(0.5)
    worker.hold(True)  # a hold begins: the final is old enough, however brief the hold
    expired = out.get(timeout=5)
    assert (expired.job_id, expired.text, expired.source) == (1, None, "ctc")
    clock.advance(0.25)
    assert worker.held_seconds == pytest.approx(0.75)  # the current hold included
    worker.hold(False)
    clock.advance(2.0)
    assert worker.num_holds == 2 and worker.num_expired == 1
    assert worker.held_seconds == pytest.approx(0.75)
    worker.stop()


class HoldRecorder:
    """Stands in for the worker: records what the engine asks of it."""

    backlog = num_temperature_fallbacks = num_with_context = num_no_voice = num_no_speech = 0
    num_holds = num_expired = num_evicted = num_refinements = num_cancelled = 0
    num_context_retries = num_beam_retries = 0
    num_decoders = 1
    busy_seconds = held_seconds = 0.0
    held = False
    no_speech = None

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def hold(self, held: bool) -> None:
        self.calls.append(held)


def _engine(engine_config: EngineConfig, yield_s: float | None,
            clock: FakeClock | None = None) -> tuple[ASREngine, HoldRecorder]:
    engine = ASREngine(replace(engine_config, second_pass_yield_s=yield_s, early_final_s=0.0),
                       clock=clock or FakeClock())
    recorder = HoldRecorder()
    engine.live.finals.worker = recorder  # type: ignore[assignment]
    return engine, recorder


def _open(engine: ASREngine, stream_id: int) -> None:
    engine.submit(OpenStream(stream_id, lambda event: None))


def test_the_engine_holds_the_second_pass_while_a_stream_is_behind(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    clock = FakeClock()
    engine, recorder = _engine(engine_config, 0.25, clock)
    _open(engine, 1)
    engine.step()
    # a live speaker's first 0.1 s, then 2.9 s more over 3 s of wall time that the engine
    # did not step through: it is seconds behind
    engine.submit(AppendAudio(1, speech[0][: RATE // 10]))
    engine.step()
    clock.advance(3.0)
    engine.submit(AppendAudio(1, speech[0][RATE // 10: 3 * RATE]))
    engine.step()
    assert recorder.calls[-1] is True
    for _ in range(50):  # decode it chunk by chunk until caught up
        engine.step()
    assert recorder.calls[-1] is False
    clock.advance(0.5)
    engine.submit(AppendAudio(1, speech[0][3 * RATE: 3 * RATE + RATE // 2]))  # half a chunk
    engine.step()
    assert recorder.calls[-1] is False  # within a chunk: on time


def test_a_stream_sending_faster_than_real_time_does_not_hold_the_second_pass(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    # 3 s of audio in no wall time (a file streamed at full speed): its backlog is its own
    engine, recorder = _engine(engine_config, 0.25)
    _open(engine, 1)
    engine.step()
    engine.submit(AppendAudio(1, speech[0][: 3 * RATE]))
    engine.step()
    assert recorder.calls[-1] is False


def test_offline_never_holds_the_second_pass(engine_config: EngineConfig,
                                             speech: list[np.ndarray]) -> None:
    engine, recorder = _engine(engine_config, None)
    _open(engine, 1)
    engine.submit(AppendAudio(1, speech[0][: 3 * RATE]))
    for _ in range(5):
        engine.step()
    assert recorder.calls == []


# -- in a process ------------------------------------------------------------------------------
def _scripted(spec: WhisperProcessSpec) -> object:
    decoder = ScriptedDecoder({1: "from the child", 2: "never"})
    decoder.release(1)
    return decoder


def _broken(spec: WhisperProcessSpec) -> object:
    raise RuntimeError("no weights here")


def child_scripted(spec: WhisperProcessSpec, commands: Any, answers: Any, may_step: Any) -> None:
    child_main(spec, commands, answers, may_step, _scripted)


def child_broken(spec: WhisperProcessSpec, commands: Any, answers: Any, may_step: Any) -> None:
    child_main(spec, commands, answers, may_step, _broken)


def _in_process(target: Any) -> tuple[SecondPassWorker, queue.Queue[Any]]:
    from oasr.engine.second_pass import process as second_pass_process

    out: queue.Queue[Any] = queue.Queue()

    def start(answered: Any, lost: Any) -> Any:
        return second_pass_process.ProcessRunner(WhisperProcessSpec(nice=5), answered, lost,
                                                 target=target)

    return SecondPassWorker(out.put, 8, start), out


def test_a_process_answers_and_reports_its_counters() -> None:
    worker, out = _in_process(child_scripted)
    quiet = np.zeros(RATE, dtype=np.float32)
    assert worker.try_submit(_job(1, _voice(0.5)))
    assert worker.try_submit(_job(3, quiet))  # no voice: answered ""
    answers = {out.get(timeout=20).job_id: None for _ in range(2)}
    assert set(answers) == {1, 3}
    deadline = time.monotonic() + 5
    while worker.num_no_voice != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.num_no_voice == 1 and worker.backlog == 0
    # the child runs `nice` steps below this process (WhisperProcessSpec(nice=5))
    child = worker._runner.process.pid  # type: ignore[attr-defined]
    assert os.getpriority(os.PRIO_PROCESS, child) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    worker.stop()
    assert not worker._runner.process.is_alive()  # type: ignore[attr-defined]


def test_a_process_that_dies_answers_what_it_held() -> None:
    worker, out = _in_process(child_scripted)
    assert worker.try_submit(_job(2, _voice(0.5)))  # scripted, never released
    os.kill(worker._runner.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    done = out.get(timeout=10)
    assert (done.job_id, done.text, done.source) == (2, None, "ctc")
    assert not worker.try_submit(_job(4, _voice(0.5)))  # the CTC text from now on
    worker.stop(timeout=2)


def test_a_process_that_cannot_load_is_refused_with_its_reason() -> None:
    with pytest.raises(ValueError, match="no weights here"):
        _in_process(child_broken)


def test_a_process_goes_on_after_ctrl_c() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the server drains on it and its
    # streams' finals still need Whisper
    worker, out = _in_process(child_scripted)
    process = worker._runner.process  # type: ignore[attr-defined]
    os.kill(process.pid, signal.SIGINT)
    process.join(0.5)  # a child that Ctrl-C ends would be gone by then
    assert process.is_alive()
    assert worker.try_submit(_job(1, _voice(0.5)))
    assert out.get(timeout=20).text == "from the child"
    worker.stop()


def test_a_process_that_cannot_start_falls_back_to_a_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    whisper = pytest.importorskip("oasr.models.whisper")
    if whisper.default_model_dir() is None:
        pytest.skip("no Whisper tiny.en weights")
    from oasr.engine.second_pass import process as second_pass_process

    def no_processes(*args: Any, **kwargs: Any) -> None:
        raise OSError("no semaphores in this sandbox")

    monkeypatch.setattr(second_pass_process, "ProcessRunner", no_processes)
    worker = SecondPassWorker.load(lambda answer: None, 4, process=True)
    assert worker is not None and worker.decoder is not None  # decoding on a thread
    worker.stop()
