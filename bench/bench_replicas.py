"""1 vs 2 ``oasr-server`` replicas behind HAProxy: how many real-time streams each holds.

    python bench/bench_replicas.py --levels 32 64 96 128 --seconds 15 \
        --out bench/results_replicas.json

Both setups use every core: one replica with ``--threads`` = cores, or two replicas with half
the threads each, behind ``deploy/haproxy/haproxy.cfg`` (least connections). Prints a table
and writes JSON (and a .md beside it). Only run it on a machine you may load fully: the servers,
HAProxy and the load generator all run here, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from oasr.benchmarks.replicas import ReplicaSetup, measure_replicas, render_markdown
from oasr.benchmarks.workload import default_audio_dir, load_bench_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[32, 64, 96, 128])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--model", default=None, help="model dir; default: the bundled model")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    max_streams = max(args.levels)
    setups = [ReplicaSetup(1, args.cores, max_streams),
              ReplicaSetup(2, max(1, args.cores // 2), max_streams)]
    bench = load_bench_model(args.model)
    result = measure_replicas(bench, default_audio_dir(), setups, args.levels, args.seconds)
    table = render_markdown(result)
    print(table)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
