"""Precision and threads side by side: the quick benchmark per (family, dtype, threads), then
the server load per dtype on the bundled model, alternated round by round.

    nice -n 15 python bench/compare_dtypes.py --out bench/results_dtypes.json \
        --markdown bench/results_dtypes.md

Every quick run is its own ``python -m oasr.cli bench --quick --json --family F --dtype D
--threads N`` process (thread pools and allocator settings are per process). Configurations
are interleaved within a round, so a burst of load from other processes on the shared box hits
all of them alike; the tables give each configuration's median over rounds. The server load
(`oasr.benchmarks.server_load.measure_server_load`: a real ``oasr-server --dtype D`` and a
separate load-generator process) runs once per dtype after the quick rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

FAMILIES = ("whisper_ctc", "conformer")
DTYPES = ("float32", "bfloat16", "int8")


def run_quick(family: str, dtype: str, threads: int) -> dict:
    """One quick benchmark in its own process: its JSON result."""
    cmd = [sys.executable, "-m", "oasr.cli", "bench", "--quick", "--json", "--family", family,
           "--dtype", dtype, "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(result: dict) -> dict[str, float]:
    """The numbers compared: speedup, real-time streams, both 64-stream step times."""
    row, head = result["throughput"][0], result["headline"]
    return {"speedup": head["speedup_batched_vs_sequential"],
            "max_realtime_streams": head["max_realtime_streams"],
            "engine_step_ms": row["engine_step_ms"], "dense_step_ms": row["dense_step_ms"],
            "engine_audio_s_per_s": row["engine_rate"],
            "load": result["machine"]["load_average_1min_at_start"]}


def server_rows(dtypes: list[str], levels: list[int], seconds: float) -> dict[str, list[dict]]:
    """The server load per dtype on the bundled model (one thread, as `oasr bench`)."""
    from oasr.benchmarks.features import blas_threads
    from oasr.benchmarks.server_load import measure_server_load
    from oasr.benchmarks.workload import default_audio_dir, load_bench_model
    from oasr.engine import configure_process

    configure_process(1)
    bench = load_bench_model(None)
    rows = {}
    with blas_threads(1):
        for dtype in dtypes:
            print(f"[compare_dtypes] server load {levels} clients, {dtype}", file=sys.stderr)
            found = measure_server_load(bench, default_audio_dir(), levels, seconds, 1,
                                        dtype=dtype)
            rows[dtype] = [dataclasses.asdict(r) | {"meets_target": r.meets_target}
                           for r in found]
    return rows


def markdown(runs: dict[str, list[dict]], server: dict[str, list[dict]]) -> str:
    lines = ["| family | dtype | threads | speedup at 64 | max real-time streams | engine step ms "
             "(64) | dense step ms (64) | engine step vs float32 |",
             "|---|---|---|---|---|---|---|---|"]
    med = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for key, rs in runs.items()}
    for key, m in med.items():
        family, dtype, threads = key.split("/")
        base = med.get(f"{family}/float32/{threads}")
        ratio = f"{base['engine_step_ms'] / m['engine_step_ms']:.2f}x" if base else "-"
        lines.append(f"| {family} | {dtype} | {threads} | {m['speedup']:.2f}x | "
                     f"{m['max_realtime_streams']:.0f} | {m['engine_step_ms']:,.0f} | "
                     f"{m['dense_step_ms']:,.0f} | {ratio} |")
    if server:
        lines += ["", "| dtype | clients | partial p50 ms | partial p95 ms | final p95 ms | "
                  "unmatched | clients with errors | p95 <= 1 s, no errors |",
                  "|---|---|---|---|---|---|---|---|"]
        for dtype, rows in server.items():
            lines += [f"| {dtype} | {r['num_clients']} | {r['partial_p50_ms']:,.0f} | "
                      f"{r['partial_p95_ms']:,.0f} | {r['final_p95_ms']:,.0f} | "
                      f"{r['num_unmatched']} | {r['num_errors']} | "
                      f"{'yes' if r['meets_target'] else 'no'} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES))
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--server-clients", type=int, nargs="*", default=[64, 128])
    p.add_argument("--server-seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: dict[str, list[dict]] = {}
    for rnd in range(args.rounds):
        for family in args.families:
            for threads in args.threads:
                for dtype in args.dtypes:
                    key = f"{family}/{dtype}/{threads}"
                    print(f"[compare_dtypes] round {rnd + 1}: {key}", file=sys.stderr)
                    runs.setdefault(key, []).append(summary(run_quick(family, dtype, threads)))
    server = (server_rows(args.dtypes, args.server_clients, args.server_seconds)
              if args.server_clients else {})
    table = markdown(runs, server)
    print(table)
    if args.out:
        args.out.write_text(json.dumps({"started_utc": started, "rounds": args.rounds,
                                        "quick_runs": runs, "server": server}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
