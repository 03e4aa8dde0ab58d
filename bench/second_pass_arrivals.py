"""The second pass's finals arriving over time, as a loaded server's worker receives them:
each final's latency from its arrival to its answer.

Segments of 3-12 s cut from `read_passages.py`'s passages arrive at random (exponential gaps of
mean ``--gap`` seconds, seeded) at one `ContinuousWhisperDecoder` with the server's decode
settings (`EngineConfig().second_pass_decode`: beam 5, int8 logits, the served dtype), which is
stepped as the worker steps it, on ``--threads`` torch threads (the worker's one by default).
Unlike `beam_batches.py` (bursts submitted at once) this shows how finals that arrive while
others decode wait. One line per gap and round: latency p50 / p90 / p95 / mean in seconds.
With ``--fast`` every final is decoded as a busy server decodes them: greedy on the segment's
own window, rows joining and leaving the running batch between tokens.

    python bench/read_passages.py --out /tmp/passages
    python bench/second_pass_arrivals.py --passages /tmp/passages --gaps 0.5 0.3 0.2
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from oasr import cpu
from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.report import machine_description


def arrivals(passages: list[np.ndarray], count: int, gap: float,
             seed: int) -> list[tuple[float, np.ndarray]]:
    """``count`` (arrival s, segment) pairs, in arrival order."""
    rng = random.Random(seed)
    out, now = [], 0.0
    for _ in range(count):
        wave = passages[rng.randrange(len(passages))]
        length = int(rng.uniform(3.0, 12.0) * MODEL_SAMPLE_RATE)
        start = rng.randrange(0, max(1, len(wave) - length))
        now += rng.expovariate(1.0 / gap) if gap > 0 else 0.0
        out.append((now, wave[start : start + length]))
    return out


def replay(decoder: object, work: list[tuple[float, np.ndarray]], fast: bool = False
           ) -> list[float]:
    """Each segment submitted at its arrival time, the decoder stepped while it has work;
    the latencies (answer - arrival), in arrival order."""
    answered: dict[int, float] = {}
    begin = time.perf_counter()
    submitted = 0
    while len(answered) < len(work):
        now = time.perf_counter() - begin
        while submitted < len(work) and work[submitted][0] <= now:
            wave = np.ascontiguousarray(work[submitted][1])
            decoder.submit(submitted, torch.from_numpy(wave),  # type: ignore[attr-defined]
                           fast=fast)
            submitted += 1
        if decoder.has_work():  # type: ignore[attr-defined]
            for result in decoder.step():  # type: ignore[attr-defined]
                answered[result.request_id] = time.perf_counter() - begin
        else:
            time.sleep(0.002)
    return [answered[i] - arrival for i, (arrival, _) in enumerate(work)]


def quantile(ordered: list[float], q: float) -> float:
    """The value at fraction ``q`` of ``ordered`` (ascending)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=Path, required=True,
                        help="a read_passages.py directory")
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.5, 0.3, 0.2],
                        help="mean seconds between arrivals")
    parser.add_argument("--count", type=int, default=60, help="segments per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per gap (seeds 1, 2, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--fast", action="store_true",
                        help="greedy finals on the segments' own windows (a busy server's)")
    args = parser.parse_args(argv)

    from oasr.engine import EngineConfig
    from oasr.models.whisper.continuous import ContinuousWhisperDecoder
    from oasr.models.whisper.transcriber import load_for_decoding

    torch.set_num_threads(args.threads)
    config = EngineConfig().second_pass_decode
    checkpoint = load_for_decoding(config, torch.device("cpu"))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    passages = [read_audio(f) for f in sorted(args.passages.glob("*.wav"))]
    if not passages:
        raise SystemExit(f"{args.passages}: no passages (python bench/read_passages.py --out DIR)")
    replay(decoder, arrivals(passages, 4, 0.0, seed=0), args.fast)  # untimed: first decodes
    machine = machine_description(torch.device("cpu"))
    decoding = "greedy, own windows" if args.fast else f"beam {config.beam_size}"
    print(f"{cpu.summary(machine)}, {args.threads} thread(s), torch {machine['torch']}, "
          f"{checkpoint.model.dtype}, {decoding}, logits {config.logits}, "
          f"{args.count} segments of 3-12 s, 1-min load "
          f"{machine.get('load_average_1min_at_start')}")
    print("| mean gap s | round | latency p50 | p90 | p95 | mean |")
    print("|---|---|---|---|---|---|")
    for gap in args.gaps:
        for round_ in range(1, args.rounds + 1):
            work = arrivals(passages, args.count, gap, seed=round_)
            latency = sorted(replay(decoder, work, args.fast))
            print(f"| {gap} | {round_} | {statistics.median(latency):.2f} "
                  f"| {quantile(latency, 0.90):.2f} | {quantile(latency, 0.95):.2f} "
                  f"| {statistics.mean(latency):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
