"""The second pass in a process of its own (the live server's choice).

A thread of the engine's process shares its GIL: Whisper's beam search is many small torch
calls and Python between them, and each time the engine thread wants the interpreter back it
may wait for the worker's switch interval. At 64 live streams on two cores that made partials
seconds late (``bench/live_text.py``). In a child process the two never share an interpreter,
and the child runs ``nice`` steps below the server, so the operating system gives the streaming
step the CPU first and the second pass takes what is left.

The child is started with ``spawn`` (a fork of a process running torch's thread pools is not
safe), loads Whisper itself (the server process never holds its weights) and then runs a
`SecondPassLoop` on the commands it reads. It reports its counters with every answer and at
least every ``COUNTERS_EVERY_S`` while it decodes. If it dies, the parent's reader notices
within ``LIVENESS_POLL_S`` and the worker answers everything outstanding as failed; if the
server dies (killed), the child notices within ``PARENT_POLL_S`` of its next wait for a
command and exits.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.engine.second_pass.jobs import Answer
from oasr.engine.second_pass.loop import Command, CommandGate, LoopCounters, SecondPassLoop
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.models.whisper.transcriber import WhisperDecodeConfig

logger = logging.getLogger(__name__)

COUNTERS_EVERY_S = 0.25  # the child's counters reach the engine at least this often
LIVENESS_POLL_S = 0.5  # the reader checks that the child is alive this often
PARENT_POLL_S = 1.0  # the child checks that the server process is alive this often
STARTUP_TIMEOUT_S = 300.0  # loading Whisper in the child (a cold disk cache is slow)


@dataclass(frozen=True)
class WhisperProcessSpec:
    """What the child needs to build its decoding side (picklable).

    Attributes:
        device: where Whisper runs (None: the default device).
        config: how it decodes (None: the decoder's defaults).
        guard: reviews Whisper's text against the CTC text (None: always kept).
        fast_backlog: see ``SecondPassLoop``.
        threads: torch intra-op threads of the child.
        nice: CPU priority steps below the server (0: the same priority).
        no_speech: when a segment holds no speech.
    """

    device: torch.device | None = None
    config: WhisperDecodeConfig | None = None
    guard: FirstPassGuard | None = None
    fast_backlog: int | None = None
    threads: int = 1
    nice: int = 10
    no_speech: NoSpeechRule | None = None


def _build_decoder(spec: WhisperProcessSpec) -> object:
    from oasr.models.whisper.continuous import ContinuousWhisperDecoder
    from oasr.models.whisper.transcriber import check_pool_admits_a_request, load_for_decoding

    decoder = ContinuousWhisperDecoder(load_for_decoding(spec.config, spec.device), spec.config)
    check_pool_admits_a_request(decoder.manager, decoder.config, decoder.ceiling)
    return decoder


def child_main(spec: WhisperProcessSpec, commands: Any, answers: Any, may_step: Any,
               build: Callable[[WhisperProcessSpec], object] = _build_decoder) -> None:
    """The child's life: lower its priority, build the decoder, say ``ready`` (or
    ``error``), then decode until a None command. Ctrl-C in a terminal reaches the whole
    process group: the child ignores it and goes on answering while the server drains; the
    server stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.nice:
        os.nice(spec.nice)
    torch.set_num_threads(spec.threads)
    try:
        decoder = build(spec)
    except Exception as exc:  # reported to the parent, which raises it as ValueError
        answers.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    answers.put(("ready", None))
    reported = [0.0]
    server, checked, orphaned = mp.parent_process(), [time.monotonic()], [False]

    def emit(answer: Answer) -> None:
        answers.put(("answer", answer, replace(loop.counters)))
        reported[0] = time.monotonic()

    def server_gone() -> bool:
        """Whether the server process died without stopping the child (killed: its queues
        stay open, the child holding both ends), asked at most every ``PARENT_POLL_S``."""
        now = time.monotonic()
        if server is None or now - checked[0] < PARENT_POLL_S:
            return False
        checked[0] = now
        return not server.is_alive()

    def get(block: bool) -> Command:
        now = time.monotonic()
        if now - reported[0] >= COUNTERS_EVERY_S:
            answers.put(("counters", replace(loop.counters)))
            reported[0] = now
        if orphaned[0]:
            raise queue.Empty  # its stop was given; the loop is ending
        while not server_gone():
            try:
                return commands.get(block=block, timeout=PARENT_POLL_S if block else None)
            except queue.Empty:
                if not block:
                    raise
        orphaned[0] = True
        return None  # a stop: a child outliving its server would hold Whisper's memory

    loop = SecondPassLoop(decoder, emit, spec.no_speech, spec.guard, spec.fast_backlog)
    loop.run(get, may_step.wait)
    if orphaned[0]:
        answers.cancel_join_thread()  # nobody reads them: exit without flushing
        return
    answers.put(("stopped", replace(loop.counters)))


class ProcessRunner(CommandGate):
    """Starts the child, forwards commands to it and its answers to ``answered`` (from a
    reader thread); calls ``lost`` once if the child dies before it is stopped.

    Raises:
        ValueError: the child could not build its decoder, or did not start in time.
    """

    def __init__(self, spec: WhisperProcessSpec, answered: Callable[[Answer], None],
                 lost: Callable[[], None],
                 target: Callable[..., None] = child_main) -> None:
        ctx = mp.get_context("spawn")
        super().__init__(ctx.Queue(), ctx.Event())
        self._answers = ctx.Queue()
        self._counters = LoopCounters()
        self._answered = answered
        self._lost = lost
        self._stopping = False
        self.process = ctx.Process(target=target, args=(spec, self._commands, self._answers,
                                                            self._may_step),
                                   name="oasr-second-pass", daemon=True)
        self.process.start()
        self._await_ready()
        self._reader = threading.Thread(target=self._read, name="oasr-second-pass-reader",
                                        daemon=True)
        self._reader.start()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                message = self._answers.get(timeout=LIVENESS_POLL_S)
                break
            except queue.Empty:
                if not self.process.is_alive() or time.monotonic() > deadline:
                    self.process.kill()
                    raise ValueError("the second-pass process did not start (exit code "
                                     f"{self.process.exitcode})") from None
        if message[0] != "ready":
            self.process.join(10)
            raise ValueError(f"the second-pass process could not load Whisper: {message[1]}")

    @property
    def counters(self) -> LoopCounters:
        return self._counters

    def stop(self, timeout: float) -> None:
        self._stopping = True
        self._commands.put(None)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        self._reader.join(timeout)
        self._commands.close()
        self._commands.cancel_join_thread()

    def _read(self) -> None:
        while True:
            try:
                message = self._answers.get(timeout=LIVENESS_POLL_S)
            except queue.Empty:
                if self.process.is_alive():
                    continue
                if not self._stopping:
                    logger.error("the second-pass process died (exit code %s)",
                                 self.process.exitcode)
                    self._lost()
                return
            except (EOFError, OSError):
                if not self._stopping:
                    self._lost()
                return
            kind = message[0]
            if kind == "stopped":
                self._counters = message[1]
                return
            self._counters = message[-1]
            if kind == "answer":
                try:
                    self._answered(message[1])
                except Exception:  # the engine's side must not kill the reader
                    logger.exception("delivering a second-pass answer failed")
