"""bench/final_draft.py reads each passage's sentences with their margins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import load_bench_script


def test_sentences_are_cut_with_their_margins_and_short_ones_left_out(tmp_path: Path) -> None:
    bench = load_bench_script("final_draft")
    rate = bench.RATE
    audio = np.arange(10 * rate, dtype=np.float32) / (10 * rate)
    sf.write(tmp_path / "p.wav", audio, rate, subtype="FLOAT")
    (tmp_path / "p.json").write_text(json.dumps({"sentences": [
        {"start": 0.1, "end": 3.0, "text": "one"},   # starts 0.1 s in: its margin is cut short
        {"start": 4.0, "end": 4.5, "text": "two"},   # 1.1 s with margins: too short
        {"start": 6.0, "end": 8.0, "text": "three"}]}))
    got = bench.sentences([tmp_path])
    assert [(name, text) for name, _, text in got] == [("p", "one"), ("p", "three")]
    assert len(got[0][1]) == int(3.3 * rate)
    third = got[1][1]
    assert len(third) == int(8.3 * rate) - int(5.7 * rate)
    assert third[0] == pytest.approx(audio[int(5.7 * rate)])
