"""Shared fixtures of the benchmark tests: the dev-set speech and one intra-op thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.paths import DEVSET_DIR

from oasr.benchmarks.workload import BenchModel, load_bench_model

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def audio_dir() -> Path:
    """The dev set's recordings in ``tests/data`` (the benchmarks' default speech)."""
    return DEVSET_DIR


@pytest.fixture()
def tiny() -> BenchModel:
    """A tiny random Conformer-CTC (named: the bundled model's family may change)."""
    return load_bench_model(tiny=True, family="conformer")


@pytest.fixture()
def tiny_whisper() -> BenchModel:
    """A tiny random Whisper-CTC (2 layers x 32, chunk 32, 1500 positions)."""
    return load_bench_model(tiny=True, family="whisper_ctc")
