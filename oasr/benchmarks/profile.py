"""Where an engine step's time goes: cProfile over a few steady steps, split by component.

Cumulative seconds of the functions that own each part of the step (DESIGN §3): features
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
        "frontend": ("oasr/models/whisper_ctc/frontend.py", "accept"),
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
