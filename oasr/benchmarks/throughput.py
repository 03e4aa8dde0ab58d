"""Throughput of the batched paged engine against the one-stream dense loop, and the largest
number of streams the engine keeps real-time.

Both ways run interleaved step by step (engine step, dense step, engine step, ...) so a burst
of load from other processes on a shared machine hits both alike; the ratio is the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from oasr.benchmarks.drivers import DenseLoop, EngineDriver, bench_engine_config, sync
from oasr.benchmarks.workload import BenchModel, load_speech


@dataclass(frozen=True)
class ThroughputRow:
    """One stream count: audio seconds decoded per wall second, both ways.

    Attributes:
        num_streams: concurrent streams.
        engine_rate: engine audio seconds per wall second.
        dense_rate: one-stream dense loop audio seconds per wall second.
        engine_step_ms: wall ms of one engine step (one chunk of every stream).
        dense_step_ms: wall ms for the dense loop to do one chunk of every stream.
    """

    num_streams: int
    engine_rate: float
    dense_rate: float
    engine_step_ms: float
    dense_step_ms: float

    @property
    def speedup(self) -> float:
        return self.engine_rate / self.dense_rate


def measure_throughput(bench: BenchModel, audio_dir: Path, num_streams: int, warmup: int,
                       steps: int, device: str = "auto", dtype: str = "auto",
                       cuda_graphs: str = "auto") -> ThroughputRow:
    """Engine vs dense loop for ``num_streams`` streams: ``warmup`` untimed steps each, then
    ``steps`` timed steps, alternating one engine step with one dense step. Both run the
    model in ``dtype`` (an `EngineConfig.dtype` name; they share the model object)."""
    total = warmup + steps
    speech = load_speech(audio_dir, num_streams, bench.chunk_seconds * (total + 2))
    config = bench_engine_config(num_streams, total + 1, device=device, dtype=dtype,
                                 cuda_graphs=cuda_graphs)
    engine = EngineDriver(bench, speech, config)
    torch_device = config.resolve_device()
    dense = DenseLoop(bench, speech, device=torch_device,
                      dtype=config.resolve_dtype(torch_device, bench.family_name),
                      int8=config.int8_linears)
    for _ in range(warmup):
        engine.step()
        dense.step()
    timed = {"engine": [0.0, 0.0], "dense": [0.0, 0.0]}  # wall s, audio s
    torch_device = engine.resources.runner.device
    drivers: tuple[tuple[str, EngineDriver | DenseLoop], ...] = (
        ("engine", engine), ("dense", dense))
    for _ in range(steps):
        for name, driver in drivers:
            sync(torch_device)
            start = time.perf_counter()
            audio = driver.step()
            sync(torch_device)
            timed[name][0] += time.perf_counter() - start
            timed[name][1] += audio
    (e_wall, e_audio), (d_wall, d_audio) = timed["engine"], timed["dense"]
    return ThroughputRow(num_streams, e_audio / e_wall, d_audio / d_wall,
                         1e3 * e_wall / steps, 1e3 * d_wall / steps)


@dataclass(frozen=True)
class RealtimeProbe:
    """One engine run at a stream count: is one step shorter than the audio it decodes?

    Attributes:
        num_streams: concurrent streams, every one with a chunk ready each step.
        step_ms: median wall ms of a timed step.
        chunk_ms: audio ms each stream gains per step (the real-time budget of a step).
    """

    num_streams: int
    step_ms: float
    chunk_ms: float

    @property
    def is_realtime(self) -> bool:
        return self.step_ms <= self.chunk_ms


def probe_realtime(bench: BenchModel, audio_dir: Path, num_streams: int, warmup: int,
                   steps: int, num_left_chunks: int = -1, device: str = "auto",
                   dtype: str = "auto", cuda_graphs: str = "auto") -> RealtimeProbe:
    """Run ``num_streams`` streams through the engine; time ``steps`` steps after ``warmup``."""
    total = warmup + steps
    speech = load_speech(audio_dir, num_streams, bench.chunk_seconds * (total + 2))
    config = bench_engine_config(num_streams, total + 1, num_left_chunks, device=device,
                                 dtype=dtype, cuda_graphs=cuda_graphs)
    driver = EngineDriver(bench, speech, config)
    driver.run(warmup)
    times = sorted(driver.run(1)[0] for _ in range(steps))
    return RealtimeProbe(num_streams, 1e3 * times[len(times) // 2], 1e3 * bench.chunk_seconds)


def search_max_realtime(probe: Callable[[int], RealtimeProbe], estimate: int,
                        max_probes: int) -> tuple[int, list[RealtimeProbe]]:
    """Largest stream count ``probe`` finds real-time, in at most ``max_probes`` probes.

    Starts at ``estimate``; grows by 1.5x while real-time and shrinks by 1.5x while not, until
    both a real-time and a too-slow count are known; then bisects down to 5% (or 2 streams).

    Returns:
        (largest real-time count seen, 0 if none; every probe in order).
    """
    probes: list[RealtimeProbe] = []
    lo, hi = 0, None  # lo: largest real-time count seen; hi: smallest count that was not
    n = max(1, estimate)
    while len(probes) < max_probes:
        result = probe(n)
        probes.append(result)
        if result.is_realtime:
            lo = max(lo, n)
        else:
            hi = n if hi is None else min(hi, n)
        if hi is None:
            n = int(n * 1.5) + 1
        elif lo == 0:
            if n == 1:
                break
            n = max(1, int(n / 1.5))
        elif hi - lo <= max(2, lo // 20):
            break
        else:
            n = (lo + hi) // 2
    return lo, probes


def find_max_realtime_streams(bench: BenchModel, audio_dir: Path, estimate: int, warmup: int,
                              steps: int, max_probes: int, num_left_chunks: int = -1,
                              device: str = "auto", dtype: str = "auto",
                              cuda_graphs: str = "auto") -> tuple[int, list[RealtimeProbe]]:
    """`search_max_realtime` over real engine runs (`probe_realtime`)."""
    def probe(n: int) -> RealtimeProbe:
        return probe_realtime(bench, audio_dir, n, warmup, steps, num_left_chunks, device,
                              dtype, cuda_graphs)

    found = search_max_realtime(probe, estimate, max_probes)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return found
