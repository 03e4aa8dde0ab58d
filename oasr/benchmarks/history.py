"""Per-chunk cost as a stream's history grows: dense concatenation versus the paged pool.

One stream (or a small batch for the paged path) runs chunks of real speech. One state per
checkpoint is advanced to just before its checkpoint chunk; then every checkpoint's chunk is
timed round-robin for a number of rounds and the fastest run of each is kept (the machine is
shared: the minimum is the least disturbed run, and round-robin spreads load bursts evenly).
Dense: the family's one-stream chunk call with dense caches concatenated every chunk
(`oasr.benchmarks.dense`; history kept up to ``chunk_size * num_left_chunks`` frames) + CTC
head. Paged: the engine's `ModelRunner` forward (pool writes, gathers through block tables) +
CTC head. A Whisper-CTC stream has at most ``max_positions`` frames (1500 = 46 chunks of 32):
its curves stop at the last full chunk (`history_checkpoints`).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from oasr.benchmarks.dense import dense_model_for
from oasr.benchmarks.drivers import (
    RunnerDriver,
    bench_engine_config,
    restore_states,
    snapshot_states,
    sync,
)
from oasr.benchmarks.workload import BenchModel, load_speech


def history_checkpoints(checkpoints: tuple[int, ...], max_chunks: int | None) -> tuple[int, ...]:
    """``checkpoints`` a stream can reach: those past ``max_chunks`` give way to ``max_chunks``
    itself and, when none lies between, the midpoint of the last kept one and it.

    ``(1, 10, 50, 100, 200)`` with 46 chunks -> ``(1, 10, 28, 46)``; None keeps all.
    """
    if max_chunks is None or max(checkpoints) <= max_chunks:
        return tuple(checkpoints)
    kept = sorted(c for c in checkpoints if c < max_chunks)
    if len(kept) < len(checkpoints) - 1 and kept and max_chunks - kept[-1] > 2:
        kept.append((kept[-1] + max_chunks) // 2)
    return (*kept, max_chunks)


@dataclass(frozen=True)
class HistoryCurve:
    """Milliseconds of one chunk's model call at chunk numbers ``checkpoints`` (1-based).

    Attributes:
        path: "dense" or "paged".
        num_left_chunks: -1 (unlimited history) or the retained chunks.
        num_streams: batch rows per call (1 for dense).
        checkpoints: chunk numbers measured.
        samples_ms: per checkpoint, the milliseconds of each timing round.
    """

    path: str
    num_left_chunks: int
    num_streams: int
    checkpoints: tuple[int, ...]
    samples_ms: tuple[tuple[float, ...], ...]

    @property
    def ms(self) -> tuple[float, ...]:
        """Fastest run at each checkpoint."""
        return tuple(min(s) for s in self.samples_ms)

    def ratio(self, late: int, early: int) -> float:
        """Cost at chunk ``late`` over cost at chunk ``early``: the median over rounds of the
        two runs' ratio within a round (timed moments apart, so both saw the same load)."""
        at = dict(zip(self.checkpoints, self.samples_ms, strict=True))
        ratios = sorted(a / b for a, b in zip(at[late], at[early], strict=True))
        return statistics.median(ratios)


def speech_windows(bench: BenchModel, audio_dir: Path, num_streams: int,
                   num_chunks: int) -> list[np.ndarray]:
    """The family's features of each stream's speech, long enough for ``num_chunks`` full
    windows."""
    seconds = bench.chunk_seconds * (num_chunks + 1)
    return [bench.features(s) for s in load_speech(audio_dir, num_streams, seconds)]


class DenseTrack:
    """One stream through the family's dense chunk call, caches concatenated every chunk."""

    def __init__(self, bench: BenchModel, model: nn.Module, feats: np.ndarray,
                 num_left_chunks: int) -> None:
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.chunk_size = bench.chunk_size
        self.dense = dense_model_for(model, bench.family_name, bench.chunk_size, num_left_chunks)
        self.windows = bench.windows(feats)
        self.cache: Any = self.dense.empty_cache()
        self.num_chunks_done = 0
        self._next: Any = None

    def run_once(self) -> float:
        """Wall seconds of the current chunk's call (caches not advanced)."""
        xs = torch.from_numpy(np.ascontiguousarray(self.windows[self.num_chunks_done]))
        xs = xs.to(self.device, self.dtype)[None]  # (1, T, F)
        sync(self.device)
        start = time.perf_counter()
        _, self._next = self.dense.forward(xs, self.chunk_size * self.num_chunks_done,
                                           self.cache)
        sync(self.device)
        return time.perf_counter() - start

    def commit(self) -> None:
        assert self._next is not None, "run_once before commit"
        self.cache = self._next
        self.num_chunks_done += 1


class PagedTrack:
    """A batch of streams through the engine's `ModelRunner` (paged pool, slot state)."""

    def __init__(self, bench: BenchModel, feats: list[np.ndarray], num_left_chunks: int,
                 num_chunks: int, device: str) -> None:
        config = bench_engine_config(len(feats), num_chunks + 1, num_left_chunks, device=device)
        self.driver = RunnerDriver(bench, feats, config)
        self.plan = self.driver.plan()
        self.driver.runner.prepare(self.plan)
        self._state_before = snapshot_states(self.driver.resources)

    def run_once(self) -> float:
        """Wall seconds of the current chunk's forward. The fixed-extent state is put back
        first, so every repeat starts from the state the chunk began with."""
        restore_states(self.driver.resources, self._state_before)
        return self.driver.time_forward(self.plan)

    @property
    def num_chunks_done(self) -> int:
        return self.driver.num_chunks_done

    def commit(self) -> None:
        self.driver.runner.commit(self.plan)
        self.driver.num_chunks_done += 1
        self.plan = self.driver.plan()
        self.driver.runner.prepare(self.plan)
        self._state_before = snapshot_states(self.driver.resources)


def measure_history(bench: BenchModel, audio_dir: Path, variants: list[tuple[str, int]],
                    checkpoints: tuple[int, ...], rounds: int, paged_streams: int = 1,
                    device: str = "auto") -> list[HistoryCurve]:
    """Curves for each (path, num_left_chunks) variant on the same speech.

    One track per (variant, checkpoint) is advanced, untimed, until it is about to run its
    checkpoint chunk. Then each of ``rounds`` rounds times every track once: variants in a
    random order, each variant's checkpoints back to back in a random order after one untimed
    warm-up run (so no checkpoint always runs first after a switch); every run is kept.
    """
    num_chunks = max(checkpoints)
    feats = speech_windows(bench, audio_dir, max(1, paged_streams), num_chunks)
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                       else ("cpu" if device == "auto" else device))
    model = bench.model.to(dev, torch.float16 if dev.type == "cuda" else torch.float32).eval()

    def make(path: str, left: int) -> DenseTrack | PagedTrack:
        if path == "dense":
            return DenseTrack(bench, model, feats[0], left)
        return PagedTrack(bench, feats, left, num_chunks, device)

    tracks = [[make(path, left) for _ in checkpoints] for path, left in variants]
    samples: list[list[list[float]]] = [[[] for _ in checkpoints] for _ in variants]
    with torch.inference_mode():
        for row in tracks:
            for track, checkpoint in zip(row, checkpoints, strict=True):
                while track.num_chunks_done < checkpoint - 1:
                    track.run_once()
                    track.commit()
        order = random.Random(0)
        for _ in range(rounds):
            for v in order.sample(range(len(variants)), len(variants)):
                row = tracks[v]
                row[0].run_once()  # untimed: absorbs the switch from the previous variant
                for c in order.sample(range(len(checkpoints)), len(checkpoints)):
                    samples[v][c].append(1e3 * row[c].run_once())
    return [
        HistoryCurve(path, left, 1 if path == "dense" else max(1, paged_streams), checkpoints,
                     tuple(tuple(s) for s in runs))
        for (path, left), runs in zip(variants, samples, strict=True)
    ]
