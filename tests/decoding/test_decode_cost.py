"""bench/decode_cost.py: the stream batch it builds and one tiny run of every setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.bench_scripts import load_bench_script

from oasr.lm import LmBuildConfig, WordLm, WordLmHeader, build_char_lm, encode_sentences
from oasr.lm.word import unigram_from_counts

from .fusion_helpers import UNITS, V, random_log_probs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "decode_cost.py"


def load_script():
    return load_bench_script("decode_cost")


def test_stream_batch_takes_long_utterances_first_and_repeats_short_ones() -> None:
    dc = load_script()
    long, short = torch.randn(10, V), torch.randn(3, V)
    batch = dc.stream_batch([short, long], 3, 8)
    assert batch.shape == (3, 8, V)
    assert batch[0].equal(long[:8])
    assert batch[1].equal(torch.cat([short, short, short])[:8])
    assert batch[2].equal(long[:8])  # fewer utterances than streams: they are reused
    with pytest.raises(ValueError, match="no utterances"):
        dc.stream_batch([], 3, 8)


def test_a_tiny_run_reports_every_setup(tmp_path: Path) -> None:
    lp = random_log_probs(3, 12, 0)
    torch.save({"sets": {"a": [(f"u{i}", lp[i], "") for i in range(3)]}}, tmp_path / "d.pt")
    lm_dir = tmp_path / "lm"
    texts = ["the cat sat", "a cat"]
    build_char_lm(encode_sentences(texts, UNITS), UNITS, LmBuildConfig(order=3)).save(lm_dir)
    words, log_probs = unigram_from_counts({"the": 2, "cat": 2, "a": 1, "sat": 1})
    WordLm(WordLmHeader.for_units(UNITS), words, log_probs).save(lm_dir)
    cmd = [sys.executable, str(SCRIPT), "--dump", str(tmp_path / "d.pt"), "--lm", str(lm_dir),
           "--beams", "2", "3", "--streams", "2", "--chunk", "4", "--steps", "2",
           "--rounds", "1", "--json", str(tmp_path / "out.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    names = ["greedy", "beam2", "beam2+lm", "beam2+lm+words", "beam3", "beam3+lm",
             "beam3+lm+words"]
    lines = [line for line in out.splitlines() if "ms per step" in line]
    assert [line.split(":")[0].strip() for line in lines] == names
    assert all(", partials " in line and line.endswith(" ms") for line in lines)
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved["ms_per_step"]) == set(saved["partials_ms"]) == set(names)
    assert all(0 < saved["partials_ms"][n] < saved["ms_per_step"][n] for n in names)
    assert "2 streams x 4 frames per step" in out
