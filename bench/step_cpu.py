"""CPU milliseconds of one engine step per dtype: a load-independent view of the step's cost.

On the shared box a wall-clock step time moves with the neighbours' load; the CPU time the
engine's own process spends on a step moves far less. For each dtype this builds one engine
(the bundled model unless ``--family``), runs ``--streams`` streams with a chunk ready every
step, and reports the median process CPU time and wall time of ``--steps`` steps after a
warm-up, dtypes alternated step by step.

    nice -n 15 python bench/step_cpu.py --dtypes float32 bfloat16 int8 --streams 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--family", default=None, choices=("conformer", "whisper_ctc"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    from oasr.benchmarks.drivers import EngineDriver, bench_engine_config
    from oasr.benchmarks.features import blas_threads
    from oasr.benchmarks.workload import default_audio_dir, load_bench_model, load_speech
    from oasr.engine import configure_process

    configure_process(args.threads)  # the process-wide settings the engine steps under
    # greedy CTC: the dtype is what differs, and the beam search's cost (the same in every
    # dtype) would only dilute the ratios
    bench = load_bench_model(None, family=args.family, beam=1)
    speech = load_speech(default_audio_dir(), args.streams,
                         bench.chunk_seconds * (args.steps + 4))
    with blas_threads(args.threads):
        drivers = {d: EngineDriver(bench, speech, bench_engine_config(
            args.streams, args.steps + 3, dtype=d)) for d in args.dtypes}
        for driver in drivers.values():
            driver.run(2)  # admission, then one warm step
        cpu: dict[str, list[float]] = {d: [] for d in args.dtypes}
        wall: dict[str, list[float]] = {d: [] for d in args.dtypes}
        for _ in range(args.steps):
            for dtype, driver in drivers.items():
                c0, w0 = time.process_time(), time.perf_counter()
                driver.run(1)
                cpu[dtype].append(time.process_time() - c0)
                wall[dtype].append(time.perf_counter() - w0)
    print(f"{bench.source} [{bench.family_name}], {args.streams} streams, {args.threads} "
          f"thread(s), median of {args.steps} steps")
    print("| dtype | CPU ms per step | wall ms per step | CPU time vs float32 |")
    print("|---|---|---|---|")
    base = statistics.median(cpu["float32"]) if "float32" in cpu else None
    for dtype in args.dtypes:
        c, w = statistics.median(cpu[dtype]), statistics.median(wall[dtype])
        ratio = f"{base / c:.2f}x" if base else "-"
        print(f"| {dtype} | {1e3 * c:,.0f} | {1e3 * w:,.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
