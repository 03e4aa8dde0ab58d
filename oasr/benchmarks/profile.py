"""Where an engine step's time goes: per torch op (`profile_step_ops`, every run) and per
component (`profile_engine_step`, cProfile, the full run).

`profile_step_ops`: torch.profiler over a few steady engine steps, each op's self time (what
the profiler calls "self CPU": time inside the op, its children's excluded) as a share of all
ops', the same view as ``prof.key_averages()`` sorted by self CPU, and the matrix multiplies'
share of it: how much of the step's op time the matrix units do, on this CPU.

`profile_engine_step`: cumulative seconds of the functions that own each part of the step (`ASREngine.step`): features
(and inside them the frontend proper: kaldi fbank or the causal log-mel), the batched model
call (and, inside it, the conv stem, the attention and the paged attention kernel), CTC
decoding, and the rest (scheduling, bookkeeping, stats). The functions differ per model
family (`COMPONENTS`). cProfile adds a little per-Python-call overhead, which falls on the
"rest" more than on the torch kernels.
"""

from __future__ import annotations

import cProfile
import pstats
from dataclasses import dataclass
from pathlib import Path

from oasr.benchmarks.drivers import EngineDriver, bench_engine_config
from oasr.benchmarks.workload import BenchModel, load_speech

_SHARED = {
    "step": ("oasr/engine/engine.py", "step"),
    "features": ("oasr/engine/engine.py", "_extract_features"),
    "model_forward": ("oasr/engine/runner/model_runner.py", "forward"),
    "paged_attention": ("oasr/fmha/paged.py", "paged_attention"),
    "decode": ("oasr/engine/runner/streams.py", "decode"),
}
# per family: component -> (file suffix, function name) whose cumulative time it is
COMPONENTS = {
    "conformer_ctc": _SHARED | {
        "frontend": ("oasr/audio/fbank.py", "accept_waveform"),
        "conv_stem": ("oasr/models/subsampling.py", "forward"),
        "attention": ("oasr/models/attention.py", "forward_paged"),
    },
    "whisper_ctc": _SHARED | {
        "frontend": ("oasr/models/whisper_ctc/frontend.py", "accept_many"),
        "conv_stem": ("oasr/models/whisper_ctc/streaming.py", "conv_stem"),
        # the whole block (attention and feed-forward): attention is not a function of its own
        "attention": ("oasr/models/whisper_ctc/streaming.py", "_block_paged"),
    },
}


@dataclass(frozen=True)
class StepProfile:
    """Milliseconds per engine step by component (``rest`` = step minus the named parts).

    Attributes:
        num_streams: streams in every step.
        steps: profiled steps.
        ms: component -> milliseconds per step; ``frontend`` is part of ``features``;
            ``conv_stem``, ``attention`` and ``paged_attention`` are parts of
            ``model_forward`` (Whisper-CTC: ``attention`` is the whole encoder block).
        family: the model family the components were taken from.
    """

    family: str
    num_streams: int
    steps: int
    ms: dict[str, float]

    @property
    def shares(self) -> dict[str, float]:
        """Each component's share of the step."""
        return {name: value / self.ms["step"] for name, value in self.ms.items()}


def _cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    total = 0.0
    for (filename, _line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and filename.replace("\\", "/").endswith(suffix):
            total += row[3]  # cumulative time
    return total


def profile_engine_step(bench: BenchModel, audio_dir: Path, num_streams: int, warmup: int = 2,
                        steps: int = 3, device: str = "auto") -> StepProfile:
    """Profile ``steps`` engine steps of ``num_streams`` streams after ``warmup`` steps."""
    speech = load_speech(audio_dir, num_streams, bench.chunk_seconds * (warmup + steps + 2))
    driver = EngineDriver(bench, speech,
                          bench_engine_config(num_streams, warmup + steps + 1, device=device))
    driver.run(warmup)
    profiler = cProfile.Profile()
    profiler.enable()
    driver.run(steps)
    profiler.disable()
    stats = pstats.Stats(profiler)
    ms = {name: 1e3 * _cumulative(stats, *where) / steps
          for name, where in COMPONENTS[bench.family_name].items()}
    ms["rest"] = ms["step"] - ms["features"] - ms["model_forward"] - ms["decode"]
    return StepProfile(bench.family_name, num_streams, steps, ms)


# Matrix multiplies, by profiler name: aten's matmul family, oneDNN's fused linears (the
# bfloat16 CPU path, `oasr.models.fused_linear`), int8 matmuls and the convolutions (matmuls
# over windows). Fused attention kernels are not counted: their softmax is not a matmul.
GEMM_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::_int_mm", "mkldnn::_linear_pointwise",
    "mkldnn::_linear_pointwise.binary", "onednn::qlinear_pointwise",
    "aten::mkldnn_convolution", "aten::convolution", "aten::_convolution",
    "aten::_mkldnn_convolution", "aten::cudnn_convolution",
})
# Fused attention kernels, by profiler name: their matmuls (the scores, the weighted sum) run
# inside one op beside the softmax, so their time is neither a GEMM's nor the elementwise rest.
ATTENTION_OPS = frozenset({
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
    "aten::_scaled_dot_product_fused_attention_overrideable",
})
TOP_OPS = 12  # ops listed in the profile


@dataclass(frozen=True)
class OpShare:
    """One torch op's part of the profiled steps.

    Attributes:
        name: the profiler's op name (``aten::addmm``, ``mkldnn::_linear_pointwise``, ...).
        share: its self time over all ops' self time.
        ms_per_step: its self milliseconds per step.
        calls_per_step: calls per step.
    """

    name: str
    share: float
    ms_per_step: float
    calls_per_step: float


@dataclass(frozen=True)
class OpProfile:
    """Per-op time of steady engine steps (torch.profiler).

    Attributes:
        num_streams: streams in every step; steps: profiled steps; dtype: the model's dtype.
        step_ms: wall milliseconds per profiled step (the profiler's overhead included).
        ops_ms: the torch ops' self milliseconds per step, all ops (what the shares divide);
            the rest of ``step_ms`` is Python outside ops (features, decoding, the engine's
            bookkeeping) and the profiler.
        ops: the `TOP_OPS` ops with the most self time, largest first.
        gemm_share: the matrix multiplies' (`GEMM_OPS`) share of ``ops_ms``.
        attention_share: the fused attention kernels' (`ATTENTION_OPS`) share of ``ops_ms``
            (0 where attention runs as separate matmuls and a softmax).
    """

    num_streams: int
    steps: int
    dtype: str
    step_ms: float
    ops_ms: float
    ops: list[OpShare]
    gemm_share: float
    attention_share: float


def profile_step_ops(bench: BenchModel, audio_dir: Path, num_streams: int, warmup: int = 2,
                     steps: int = 3, device: str = "auto", dtype: str = "auto") -> OpProfile:
    """torch.profiler over ``steps`` engine steps of ``num_streams`` streams (model dtype
    ``dtype``, an `EngineConfig.dtype` name) after ``warmup`` steps. On CUDA the shares are
    of the kernels' device time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    speech = load_speech(audio_dir, num_streams, bench.chunk_seconds * (warmup + steps + 2))
    config = bench_engine_config(num_streams, warmup + steps + 1, device=device, dtype=dtype)
    driver = EngineDriver(bench, speech, config)
    driver.run(warmup)
    cuda = driver.resources.runner.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        seconds, _ = driver.run(steps)
    # on CUDA an op's host time is its launch: its kernels' device time is its cost (the
    # kernels' own rows are left out, their time is their op's)
    rows = [(e.key, e.self_device_time_total if cuda else e.self_cpu_time_total, e.count)
            for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    total = sum(us for _, us, _ in rows) or 1.0
    rows.sort(key=lambda r: r[1], reverse=True)
    ops = [OpShare(name, us / total, us / 1e3 / steps, calls / steps)
           for name, us, calls in rows[:TOP_OPS]]
    gemm = sum(us for name, us, _ in rows if name in GEMM_OPS) / total
    attention = sum(us for name, us, _ in rows if name in ATTENTION_OPS) / total
    runner = driver.resources.runner
    return OpProfile(num_streams, steps, str(runner.dtype).removeprefix("torch."),
                     1e3 * seconds / steps, total / 1e3 / steps, ops, gemm, attention)
