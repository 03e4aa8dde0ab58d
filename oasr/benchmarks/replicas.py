"""1 vs N ``oasr-server`` replicas behind HAProxy: real-time streams each setup holds.

Each setup runs the same model on the same machine: R replicas (``--threads`` each), HAProxy
running ``deploy/haproxy/haproxy.cfg`` in front, and the load generator (its own process,
`oasr.benchmarks.loadgen`) sending N real-time clients through HAProxy at each load level.
A level is held when no client saw an error and partial latency p95 stays within 1 s
(`ServerLoadRow.meets_target`). Everything is bounded: fixed audio per client, a deadline per
level, and every process stopped by its own pid when the setup ends.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oasr.benchmarks.haproxy import running_haproxy
from oasr.benchmarks.server_load import (
    ServerLoadRow,
    expected_partials,
    run_load_level,
    running_server,
    save_bench_model,
)
from oasr.benchmarks.workload import BenchModel
from oasr.engine import EngineConfig


@dataclass(frozen=True)
class ReplicaSetup:
    """``num_replicas`` servers of ``threads`` torch threads and ``max_streams`` slots each."""

    num_replicas: int
    threads: int
    max_streams: int


def measure_setup(bench: BenchModel, audio_dir: Path, setup: ReplicaSetup, levels: list[int],
                  seconds: float, workdir: Path, model_dir: Path,
                  expected: list[list[tuple[str, int]]]) -> list[ServerLoadRow]:
    """Start the setup's replicas and HAProxy, run every load level through HAProxy."""
    chunks = math.ceil(seconds / bench.chunk_seconds) + 4
    with contextlib.ExitStack() as stack:
        replicas = {}
        for index in range(setup.num_replicas):
            replicas[f"r{index}"] = stack.enter_context(running_server(
                model_dir, setup.max_streams, setup.max_streams * chunks,
                workdir / f"server{setup.num_replicas}_{index}.log", setup.threads))
        proxy_dir = workdir / f"haproxy{setup.num_replicas}"
        proxy_dir.mkdir()
        address, _ = stack.enter_context(running_haproxy(replicas, proxy_dir))
        return [run_load_level(address, n, audio_dir, seconds, expected, workdir)
                for n in levels]


def measure_replicas(bench: BenchModel, audio_dir: Path, setups: list[ReplicaSetup],
                     levels: list[int], seconds: float) -> dict[str, Any]:
    """Every setup at every level; the result as JSON-ready data."""
    top = max(levels)
    chunks = math.ceil(seconds / bench.chunk_seconds) + 4
    started = time.time()
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="oasr-replicas-") as tmp:
        workdir = Path(tmp)
        model_dir = save_bench_model(bench, workdir / "model")
        config = EngineConfig(max_batch_size=top, max_num_blocks=top * chunks,
                              max_wait_time_s=math.inf, idle_timeout_s=math.inf,
                              max_session_s=math.inf, max_pending_audio_s=math.inf)
        expected = expected_partials(bench, audio_dir, top, seconds, config)
        for setup in setups:
            rows = measure_setup(bench, audio_dir, setup, levels, seconds, workdir,
                                 model_dir, expected)
            held = [r.num_clients for r in rows if r.meets_target]
            results.append({"setup": asdict(setup), "rows": [asdict(r) for r in rows],
                            "max_streams_held": max(held, default=0)})
    return {"model": bench.source, "family": bench.family_name, "seconds": seconds,
            "levels": levels, "cpu_count": os.cpu_count(), "load_before": load_before,
            "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
            "elapsed_s": round(time.time() - started, 1), "setups": results}


def render_markdown(result: dict[str, Any]) -> str:
    """The result as a table: one row per setup and load level."""
    lines = [f"Model: {result['model']} ({result['family']}); {result['seconds']:g} s of "
             f"real-time audio per client; {result['cpu_count']} CPUs; 1-minute load "
             f"{result['load_before']:.2f} before the run; started {result['started_utc']} "
             "UTC.", "",
             "| replicas x threads | clients | partial p50 ms | partial p95 ms | final p95 ms "
             "| errors | held |", "|---|---|---|---|---|---|---|"]
    for entry in result["setups"]:
        setup = entry["setup"]
        for row in entry["rows"]:
            held = row["num_errors"] == 0 and row["partial_p95_ms"] <= 1000.0
            lines.append(
                f"| {setup['num_replicas']} x {setup['threads']} | {row['num_clients']} | "
                f"{row['partial_p50_ms']:,.0f} | {row['partial_p95_ms']:,.0f} | "
                f"{row['final_p95_ms']:,.0f} | {row['num_errors']} | {'yes' if held else 'no'} |")
    lines.append("")
    for entry in result["setups"]:
        setup = entry["setup"]
        lines.append(f"- {setup['num_replicas']} replica(s) x {setup['threads']} thread(s): "
                     f"holds {entry['max_streams_held']} real-time streams")
    return "\n".join(lines) + "\n"
