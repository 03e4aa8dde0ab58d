"""bench/beam_batches.py's batches: clips of the asked length from each recording's offset,
pulled back to fit, and the dev set's batches built from the repository's recordings."""

from __future__ import annotations

from typing import Any

import numpy as np
from support.bench_scripts import load_bench_script

from oasr.audio import MODEL_SAMPLE_RATE
from oasr.benchmarks.workload import DEVSET_DIR


def load_script() -> Any:
    return load_bench_script("beam_batches")


def test_clips_keep_their_length_and_pull_a_late_offset_back() -> None:
    bench = load_script()
    rate = MODEL_SAMPLE_RATE
    waves = [np.arange(10 * rate, dtype=np.float32), np.arange(4 * rate, dtype=np.float32)]
    early, late = bench.clips(waves, 3.0, [2.0, 3.5])
    assert len(early) == len(late) == 3 * rate
    assert early[0] == 2 * rate  # from its offset
    assert late[0] == 1 * rate and late[-1] == 4 * rate - 1  # pulled back: the recording's end


def test_the_dev_set_batches_come_from_the_repository() -> None:
    bench = load_script()
    work = bench.batches(DEVSET_DIR, None)
    assert set(work) == {"dev", "dev-5s"}
    assert len(work["dev"]) == len(list(DEVSET_DIR.glob("*.wav")))
    assert all(len(w) == 5 * MODEL_SAMPLE_RATE for w in work["dev-5s"])
