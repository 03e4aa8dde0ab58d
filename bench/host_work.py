"""The engine thread's host work per step against its model call, at many streams.

One `ASREngine` with the server's live-text policy (endpointing, quiet-tail cuts, partials,
finals; the second pass off unless ``--second-pass whisper``) and its CTC decoding (beam 16
with the model's LMs; ``--beam-size 1`` for greedy) steps ``--streams`` streams of
dev-set speech, each fed one chunk of audio before every step, as clients at real-time pace
would (in one message, or with ``--message-ms 100`` in 100 ms messages, as the browser page
sends them: the per-message work then counts as a server's does). Each step's wall time is
split by the functions that own its parts:

- ``features``: the engine's feature extraction (`ASREngine._extract_features`);
- ``model``: the batched encoder call (`ModelRunner.forward`), staging included;
- ``decode``: the batched CTC search and its read-back (`StreamResources.decode`);
- ``host``: everything else on the engine thread: commands, scheduling, bookkeeping per
  stream, the live-text policy (`oasr.engine.live`), events, stats;
- inside ``host``: ``commands`` (the queued audio appended, `ASREngine._apply_commands`),
  ``schedule`` (`Scheduler.schedule`), ``prepare`` (each row's block, `ModelRunner.prepare`),
  ``commit`` (`ModelRunner.commit`: state rows written, K/V frames counted), ``live`` (the
  policy's `after_chunk` for every row and `after_step`) and ``stats``
  (`EngineStats.record_step`).

Both the wall milliseconds (median over steps) and the engine thread's CPU milliseconds
(``time.thread_time``: what the thread itself ran, less sensitive to the neighbours' load;
the model call's other intra-op threads are not in it) are printed. ``--profile`` adds the
cProfile functions with the most own time over the measured steps (cProfile slows Python,
so its figures are for ranking, not for the table).

    python bench/host_work.py --streams 256 --steps 6 --threads 2 [--message-ms 100]
    python bench/host_work.py --streams 256 --steps 4 --profile 25
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import math
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

PARTS = ("step", "features", "model", "decode", "host", "commands", "schedule", "prepare",
         "commit", "live", "stats")
HOST_PARTS = {"commands": "host: commands (audio in)", "schedule": "host: scheduling",
              "prepare": "host: block allocation", "commit": "host: commit (state, K/V counts)",
              "live": "host: live policy", "stats": "host: stats"}


class StepTimer:
    """Wall and thread-CPU seconds of the wrapped functions, per step."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.steps: list[tuple[dict[str, float], dict[str, float]]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[name] += time.perf_counter() - w0
                self.cpu[name] += time.thread_time() - c0
        return timed

    def end_step(self) -> None:
        wall, cpu = dict(self.wall), dict(self.cpu)
        for d in (wall, cpu):
            d["host"] = d.get("step", 0.0) - sum(d.get(k, 0.0)
                                                 for k in ("features", "model", "decode"))
        self.steps.append((wall, cpu))
        self.wall.clear()
        self.cpu.clear()


def build_engine(args: argparse.Namespace, timer: StepTimer) -> tuple[Any, Any, list[Any]]:
    """The engine with its functions wrapped, the bench model, the per-stream speech."""
    from oasr.benchmarks.workload import default_audio_dir, load_bench_model, load_speech
    from oasr.engine import ASREngine, EngineConfig
    from oasr.engine.runner.streams import StreamResources

    bench = load_bench_model(None, beam=args.beam)
    num_chunks = args.warmup + args.steps + 2
    speech = load_speech(default_audio_dir(), args.streams, bench.chunk_seconds * num_chunks)
    config = EngineConfig(
        device="cpu", dtype=args.dtype, max_batch_size=args.streams,
        max_num_blocks=args.streams * (num_chunks + 2), max_blocks_per_seq=num_chunks + 2,
        max_wait_time_s=math.inf, idle_timeout_s=math.inf, max_pending_audio_s=math.inf,
        second_pass=args.second_pass, num_threads=args.threads)
    config = bench.with_decoding(config)  # the server's CTC beam and LMs, or --beam's
    engine = ASREngine(config, StreamResources.build(config, bench.model))
    engine.step = timer.wrap("step", engine.step)
    engine._extract_features = timer.wrap("features", engine._extract_features)
    runner = engine.resources.runner
    runner.forward = timer.wrap("model", runner.forward)
    engine.resources.decode = timer.wrap("decode", engine.resources.decode)
    engine.scheduler.schedule = timer.wrap("schedule", engine.scheduler.schedule)
    engine._apply_commands = timer.wrap("commands", engine._apply_commands)
    runner.prepare = timer.wrap("prepare", runner.prepare)
    runner.commit = timer.wrap("commit", runner.commit)
    engine.stats.record_step = timer.wrap("stats", engine.stats.record_step)
    engine.live.after_chunk = timer.wrap("live", engine.live.after_chunk)
    engine.live.after_step = timer.wrap("live", engine.live.after_step)
    return engine, bench, speech


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=6, help="measured steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam-size", dest="beam", type=int, default=None, metavar="N",
                   help="the CTC beam (1: greedy); default: the server's (16, the model's LMs)")
    p.add_argument("--message-ms", type=float, default=None, metavar="MS",
                   help="send each stream's audio in messages of this many milliseconds (the "
                        "browser page sends 100), several per step; default: one message per "
                        "step")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--second-pass", default="none", choices=("none", "whisper"))
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print cProfile's N functions with the most own time")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args()

    from oasr.benchmarks.features import blas_threads
    from oasr.engine import configure_process, freeze_startup_objects
    from oasr.engine.commands import AppendAudio, OpenStream

    configure_process(args.threads)
    timer = StepTimer()
    events: list[Any] = []
    with blas_threads(args.threads):
        engine, bench, speech = build_engine(args, timer)
        freeze_startup_objects()  # as the server does once its engine is ready
        first = bench.samples_for_frames(bench.chunk_size)
        step_samples = bench.chunk_samples
        positions = [0] * len(speech)
        message = None if args.message_ms is None else round(args.message_ms * 16)  # samples
        for stream in range(len(speech)):
            engine.submit(OpenStream(stream, events.append))

        def feed_and_step() -> None:
            for stream, audio in enumerate(speech):
                start = positions[stream]
                size = first if start == 0 else step_samples
                positions[stream] = start + size
                piece = audio[start : start + size]
                per_message = message or len(piece) or 1
                for at in range(0, len(piece), per_message):
                    engine.submit(AppendAudio(stream, piece[at : at + per_message]))
            engine.step()
            timer.end_step()

        for _ in range(args.warmup):
            feed_and_step()
        timer.steps.clear()
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        for _ in range(args.steps):
            feed_and_step()
        if profiler is not None:
            profiler.disable()
        engine.shutdown()

    import os

    import torch

    load = os.getloadavg()[0]
    print(f"{bench.source}, {args.streams} streams, dtype {engine.resources.runner.dtype}, "
          f"{args.threads} thread(s), median of {args.steps} steps after {args.warmup}; "
          f"torch {torch.__version__}; 1-min load {load:.1f}")
    print("| part | wall ms per step | share of the step | engine-thread CPU ms | "
          "µs per stream (CPU) |")
    print("|---|---|---|---|---|")
    medians = {}
    for part in PARTS:
        wall = statistics.median(s[0].get(part, 0.0) for s in timer.steps)
        cpu = statistics.median(s[1].get(part, 0.0) for s in timer.steps)
        step = statistics.median(s[0]["step"] for s in timer.steps)
        medians[part] = {"wall_ms": 1e3 * wall, "cpu_ms": 1e3 * cpu}
        label = HOST_PARTS.get(part, part)
        print(f"| {label} | {1e3 * wall:,.1f} | {wall / step:.1%} | {1e3 * cpu:,.1f} | "
              f"{1e6 * cpu / args.streams:,.1f} |")
    host, model = medians["host"]["cpu_ms"], medians["model"]["wall_ms"]
    print(f"host work (engine thread, CPU) / model call (wall): {host / model:.3f}")
    if args.json:
        print(json.dumps({"streams": args.streams, "threads": args.threads,
                          "load_1min": load, "parts": medians,
                          "host_over_model": host / model}))
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
