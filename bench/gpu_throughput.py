"""Engine vs dense loop on a GPU, CUDA graphs on and off, one JSON line per measurement.

    python bench/gpu_throughput.py OUT.jsonl [--streams 1 64 256 1024] [--realtime-probes 4]

Each line is written as soon as it is measured (a run cut short keeps what it measured):
``{"kind": "throughput", "cuda_graphs": "on", "num_streams": 64, "engine_step_ms": ...,
"dense_step_ms": ..., "speedup": ..., "captured_shapes": ...}``, then the real-time stream
search with the first mode (``"kind": "realtime"``). bench/gpu_check.sh runs it;
``--device cpu --modes off`` runs the same on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from oasr.benchmarks.throughput import find_max_realtime_streams, measure_throughput
from oasr.benchmarks.workload import default_audio_dir, load_bench_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256, 1024])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--realtime-probes", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--modes", nargs="+", default=["on", "off"], help="cuda_graphs values")
    args = p.parse_args()
    bench = load_bench_model(None)
    audio = default_audio_dir()
    with args.out.open("a") as out:
        def write(record: dict) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(record, file=sys.stderr, flush=True)

        best = 1
        for n in args.streams:
            for graphs in args.modes:
                started = time.perf_counter()
                row = measure_throughput(bench, audio, n, args.warmup, args.steps, args.device,
                                         args.dtype, graphs)
                write({"kind": "throughput", "cuda_graphs": graphs, "family": bench.family_name,
                       **dataclasses.asdict(row), "speedup": row.speedup,
                       "wall_s": round(time.perf_counter() - started, 1)})
                if graphs == args.modes[0]:
                    best = max(best, int(row.engine_rate * 0.9))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        found, probes = find_max_realtime_streams(
            bench, audio, best, warmup=3, steps=3, max_probes=args.realtime_probes,
            device=args.device, dtype=args.dtype, cuda_graphs=args.modes[0])
        write({"kind": "realtime", "cuda_graphs": args.modes[0], "max_realtime_streams": found,
               "probes": [dataclasses.asdict(p) | {"is_realtime": p.is_realtime}
                          for p in probes]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
