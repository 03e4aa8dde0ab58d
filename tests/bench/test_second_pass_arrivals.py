"""bench/second_pass_arrivals.py: seeded arrivals of 3-12 s segments in order, and the replay
that submits each at its time and measures answer minus arrival."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from support.bench_scripts import load_bench_script

from oasr.audio import MODEL_SAMPLE_RATE


def load_script() -> Any:
    return load_bench_script("second_pass_arrivals")


def test_arrivals_are_seeded_ordered_segments_of_three_to_twelve_seconds() -> None:
    bench = load_script()
    passages = [np.arange(60 * MODEL_SAMPLE_RATE, dtype=np.float32)]
    work = bench.arrivals(passages, 20, 0.3, seed=1)
    times = [t for t, _ in work]
    assert times == sorted(times) and times[0] > 0
    assert all(3 * MODEL_SAMPLE_RATE <= len(w) <= 12 * MODEL_SAMPLE_RATE for _, w in work)
    assert 0.1 < times[-1] / 20 < 0.6  # exponential gaps of mean 0.3 s
    again = bench.arrivals(passages, 20, 0.3, seed=1)
    assert [t for t, _ in again] == times
    assert bench.arrivals(passages, 20, 0.3, seed=2)[0][0] != times[0]


@dataclass
class _Result:
    request_id: int


class _Decoder:
    """Answers each request one step after it was submitted, each step taking 20 ms."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.fast: list[bool] = []

    def submit(self, request_id: int, wave: Any, fast: bool = False) -> None:
        self.pending.append(request_id)
        self.fast.append(fast)

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[_Result]:
        time.sleep(0.02)
        done, self.pending = self.pending, []
        return [_Result(i) for i in done]


def test_replay_measures_each_answer_from_its_arrival() -> None:
    bench = load_script()
    wave = np.zeros(MODEL_SAMPLE_RATE, dtype=np.float32)
    decoder = _Decoder()
    latency = bench.replay(decoder, [(0.0, wave), (0.1, wave), (0.3, wave)])
    assert len(latency) == 3 and all(0.015 < s < 0.2 for s in latency)
    assert decoder.fast == [False] * 3
    fast = _Decoder()
    bench.replay(fast, [(0.0, wave), (0.05, wave)], fast=True)  # --fast: a busy server's finals
    assert fast.fast == [True, True]
    assert bench.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert bench.quantile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
