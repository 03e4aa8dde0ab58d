"""Achieved encoder GFLOP/s at a batch size, against this machine's measured matmul peak.

FLOPs are counted by torch's ``FlopCounterMode`` on one real batched forward (matmuls, linear
layers and convolutions: the operations that carry the arithmetic); the same forward is then
timed, alternating with the peak measurement (the best rate of large square matmuls in the
model's dtype on the same device and thread count) so both see the same machine load.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from oasr.benchmarks.drivers import RunnerDriver, bench_engine_config, sync
from oasr.benchmarks.history import speech_windows
from oasr.benchmarks.workload import BenchModel


@dataclass(frozen=True)
class ComputeResult:
    """Encoder arithmetic rate at one batch size.

    Attributes:
        num_streams: batch rows of the forward.
        history_chunks: chunks each stream held before the timed chunk.
        gflop_per_step: counted GFLOP of one batched forward (encoder + CTC head).
        step_ms: best wall ms of that forward.
        peak_gflops: measured matmul peak (GFLOP/s).
        matmul_size: n of the n x n x n matmuls that gave the peak.
    """

    num_streams: int
    history_chunks: int
    gflop_per_step: float
    step_ms: float
    peak_gflops: float
    matmul_size: int

    @property
    def gflops(self) -> float:
        return self.gflop_per_step / (self.step_ms / 1e3)

    @property
    def fraction_of_peak(self) -> float:
        return self.gflops / self.peak_gflops


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 1024,
                        repeats: int = 5) -> float:
    """Best GFLOP/s of ``size``-cubed matmuls (``repeats`` timed rounds of several calls)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    calls = 4 if device.type == "cpu" else 50
    torch.mm(a, b, out=out)
    best = math.inf
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        sync(device)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2 * size**3 / best / 1e9


def measure_compute(bench: BenchModel, audio_dir: Path, num_streams: int, history_chunks: int,
                    repeats: int, device: str = "auto") -> ComputeResult:
    """Count and time one batched forward of ``num_streams`` streams after ``history_chunks``
    chunks; best of ``repeats`` forwards, each followed by a peak measurement."""
    feats = speech_windows(audio_dir, num_streams, history_chunks + 1)
    config = bench_engine_config(num_streams, history_chunks + 2, device=device)
    driver = RunnerDriver(bench.model, feats, config)
    runner = driver.runner
    size = 1024 if runner.device.type == "cpu" else 4096
    with torch.inference_mode():
        for _ in range(history_chunks):
            driver.advance()
        plan = driver.plan()
        runner.prepare(plan)
        saved = driver.resources.cnn.buffer.clone()
        counter = FlopCounterMode(display=False)
        with counter:
            runner.forward(plan)
        seconds, peak = math.inf, 0.0
        for _ in range(repeats):  # forward and peak alternate: both see the same load
            driver.resources.cnn.buffer.copy_(saved)
            seconds = min(seconds, driver.time_forward(plan))
            peak = max(peak, measure_matmul_peak(runner.device, runner.dtype, size, repeats=2))
        driver.resources.cnn.buffer.copy_(saved)
    return ComputeResult(num_streams, history_chunks, counter.get_total_flops() / 1e9,
                         1e3 * seconds, peak, size)
