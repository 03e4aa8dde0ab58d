"""Achieved encoder GFLOP/s at a batch size, against this machine's measured matmul peak.

FLOPs are counted by torch's ``FlopCounterMode`` on one real batched forward (matmuls, linear
layers and convolutions: the operations that carry the arithmetic; oneDNN's fused linears and
the CPU flash attention through `EXTRA_FLOP_FORMULAS`); the same forward is then
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

from oasr.benchmarks.drivers import (
    RunnerDriver,
    bench_engine_config,
    restore_states,
    snapshot_states,
    sync,
)
from oasr.benchmarks.history import speech_windows
from oasr.benchmarks.workload import BenchModel
from oasr.models.checkpoint import WHISPER_CTC
from oasr.models.whisper_ctc import WhisperCtcConfig


def _fused_linear_flops(*shapes: object, out_shape: tuple[int, ...], **_: object) -> int:
    """``mkldnn::_linear_pointwise`` (and ``.binary``): X (..., K) by W (N, K) -> (..., N)."""
    x_shape = shapes[0]
    assert isinstance(x_shape, tuple | torch.Size)
    return 2 * math.prod(out_shape) * int(x_shape[-1])


def _cpu_flash_flops(q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                     v_shape: tuple[int, ...], *_: object, out_shape: object = None,
                     **__: object) -> int:
    """CPU flash attention, q (B, H, T, D) over k, v (B, H, L, D): Q K^T and P V."""
    b, h, t, d = q_shape
    return 2 * b * h * t * k_shape[2] * d + 2 * b * h * t * k_shape[2] * v_shape[3]


# ops torch's FlopCounterMode has no formula for (it would count them as 0)
EXTRA_FLOP_FORMULAS = {
    torch.ops.mkldnn._linear_pointwise: _fused_linear_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
}


def whisper_ctc_flops(config: WhisperCtcConfig, chunk_frames: int, history_frames: int) -> int:
    """FLOPs (2 per multiply-add) of one Whisper-CTC stream-chunk: ``chunk_frames`` = C
    encoder frames (2C log-mel frames) attending to ``history_frames`` = S cached frames.

    With width W, mel bins M, layers L, vocabulary V (matmuls, linears and convolutions only;
    norms, GELU and softmax are not counted)::

        conv1 (k 3, 2C outputs):           2 * 2C * W * M * 3
        conv2 (k 3, stride 2, C outputs):  2 * C * W * W * 3
        per layer: qkv 2C*W*3W + out 2C*W*W + FFN 2C*W*4W*2   = 24 C W^2
                   Q K^T and A V over S + C keys                = 4 C (S + C) W
        CTC head:                          2 * C * W * V

    ``WhisperCtcConfig()`` (W 384, M 80, L 4, V 31), C 32: 0.500 GFLOP at S = 0, 0.525 at
    S = 128 (num_left_chunks 4), 0.783 at S = 1,440 (the last chunk of 30 s).
    """
    c, s, w = chunk_frames, history_frames, config.width
    conv = 2 * (2 * c) * w * config.n_mels * 3 + 2 * c * w * w * 3
    layers = config.layers * (24 * c * w * w + 4 * c * (s + c) * w)
    return conv + layers + 2 * c * w * config.vocab_size


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
        formula_gflop_per_step: the same forward's GFLOP from the family's formula
            (`whisper_ctc_flops`; None for the Conformer, whose count is the counter's alone).
    """

    num_streams: int
    history_chunks: int
    gflop_per_step: float
    step_ms: float
    peak_gflops: float
    matmul_size: int
    formula_gflop_per_step: float | None = None

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
                    repeats: int, device: str = "auto", dtype: str = "auto") -> ComputeResult:
    """Count and time one batched forward of ``num_streams`` streams after ``history_chunks``
    chunks in model dtype ``dtype`` (an `EngineConfig.dtype` name); best of ``repeats``
    forwards, each followed by a peak measurement in the same dtype."""
    feats = speech_windows(bench, audio_dir, num_streams, history_chunks + 1)
    config = bench_engine_config(num_streams, history_chunks + 2, device=device, dtype=dtype)
    driver = RunnerDriver(bench, feats, config)
    runner = driver.runner
    size = 1024 if runner.device.type == "cpu" else 4096
    with torch.inference_mode():
        for _ in range(history_chunks):
            driver.advance()
        plan = driver.plan()
        runner.prepare(plan)
        saved = snapshot_states(driver.resources)
        counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)
        with counter:
            runner.forward(plan)
        seconds, peak = math.inf, 0.0
        for _ in range(repeats):  # forward and peak alternate: both see the same load
            restore_states(driver.resources, saved)
            seconds = min(seconds, driver.time_forward(plan))
            peak = max(peak, measure_matmul_peak(runner.device, runner.dtype, size, repeats=2))
        restore_states(driver.resources, saved)
    formula = None
    if bench.family_name == WHISPER_CTC:
        chunk = bench.chunk_size
        per_stream = whisper_ctc_flops(bench.config, chunk, history_chunks * chunk)  # type: ignore[arg-type]
        formula = num_streams * per_stream / 1e9
    return ComputeResult(num_streams, history_chunks, counter.get_total_flops() / 1e9,
                         1e3 * seconds, peak, size, formula)
