"""The Whisper-CTC encoder block under ``torch.compile`` against the hand-fused eager block.

The engine's block runs its linears as fused oneDNN calls (`oasr.models.fused_linear`: bias,
GELU and residual add inside the matmul, on prepacked weights), which inductor cannot lower.
This compares three ways of running the same steady engine steps (history full at
``--num-left-chunks``):

- ``fused``: the engine as it serves (eager, fused linears);
- ``plain``: eager with the fused linears off (``F.linear``, GELU and the adds as ops);
- ``compiled``: ``plain`` with the block (``streaming._block_paged``) compiled by inductor,
  ``dynamic=False`` (one graph per batch width, as a bucketed server would warm them).

Each variant runs in a process of its own (the switch and the compiled code are process-wide),
the variants alternated over ``--rounds``; each prints its median step and the seconds its
first steps took (the compile, for ``compiled``).

    python bench/compiled_block.py --streams 64 256 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("fused", "plain", "compiled")


def one(variant: str, streams: int, steps: int, left: int, threads: int) -> dict[str, float]:
    """Median wall ms of ``steps`` engine steps of ``streams`` streams, in this process."""
    import torch

    import oasr.models.fused_linear as fused_linear
    import oasr.models.whisper_ctc.streaming as streaming
    from oasr.benchmarks.drivers import EngineDriver, bench_engine_config
    from oasr.benchmarks.workload import default_audio_dir, load_bench_model, load_speech

    torch.set_num_threads(threads)
    if variant in ("plain", "compiled"):
        fused_linear._onednn_bf16 = lambda: False  # type: ignore[assignment]
    if variant == "compiled":
        streaming._block_paged = torch.compile(streaming._block_paged, dynamic=False)
    # greedy CTC: the block is what differs, and the beam search's cost (the same for
    # every variant) would only dilute the comparison
    bench = load_bench_model(beam=1)
    warmup = left + 2  # the history full, every width compiled
    speech = load_speech(default_audio_dir(), streams, bench.chunk_seconds * (warmup + steps + 2))
    driver = EngineDriver(bench, speech, bench_engine_config(streams, warmup + steps + 1,
                                                             num_left_chunks=left))
    start = time.perf_counter()
    driver.run(warmup)
    first_s = time.perf_counter() - start
    times = [driver.run(1)[0] for _ in range(steps)]
    return {"step_ms": 1e3 * statistics.median(times), "first_steps_s": first_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="measured steps per run")
    parser.add_argument("--num-left-chunks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        result = one(args.one, args.streams[0], args.steps, args.num_left_chunks, args.threads)
        print(json.dumps(result))
        return 0
    print(f"1-min load {os.getloadavg()[0]:.1f}, {args.threads} thread(s), history "
          f"{args.num_left_chunks} chunks, median of {args.steps} steps per run")
    print("| streams | variant | step ms per run | first steps s per run |")
    print("|---|---|---|---|")
    for streams in args.streams:
        rows: dict[str, list[dict[str, float]]] = {v: [] for v in args.variants}
        for _ in range(args.rounds):
            for variant in args.variants:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", variant, "--streams", str(streams),
                     "--steps", str(args.steps), "--num-left-chunks", str(args.num_left_chunks),
                     "--threads", str(args.threads)],
                    check=True, capture_output=True, text=True).stdout
                rows[variant].append(json.loads(out.strip().splitlines()[-1]))
        for variant, runs in rows.items():
            steps = ", ".join(f"{r['step_ms']:.1f}" for r in runs)
            firsts = ", ".join(f"{r['first_steps_s']:.1f}" for r in runs)
            print(f"| {streams} | {variant} | {steps} | {firsts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
