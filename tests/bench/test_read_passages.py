"""bench/read_passages.py's stress variant: pauses paced as asked, speech re-levelled and
mixed with noise at the asked signal-to-noise ratio."""

from __future__ import annotations

import numpy as np
import pytest

from oasr.audio import MODEL_SAMPLE_RATE as SR
from tests.conftest import load_bench_script


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


@pytest.mark.parametrize("pacing", ["read", "tight"])
def test_join_puts_breaths_and_sentence_pauses_in_the_pacings_ranges(pacing: str) -> None:
    bench = load_bench_script("read_passages")
    breath_s, pause_s = bench.PACINGS[pacing]
    sentences = [[tone(0.5), tone(0.4)], [tone(0.6)], [tone(0.3), tone(0.3)]]
    audio, spans = bench.join(sentences, np.random.default_rng(0), pacing=pacing)
    # a sentence's span: its clips and the breaths between them
    (a0, a1), (b0, b1), (c0, c1) = spans
    assert breath_s[0] <= (a1 - a0) - 0.9 <= breath_s[1] + 1e-3
    assert pause_s[0] <= b0 - a1 <= pause_s[1] + 1e-3
    assert pause_s[0] <= c0 - b1 <= pause_s[1] + 1e-3
    assert (b1 - b0) == pytest.approx(0.6, abs=1e-3)
    assert len(audio) / SR == pytest.approx(c1 + 1.0, abs=1e-3)  # 1 s after the last


def test_degrade_re_levels_and_mixes_noise_at_the_asked_snr() -> None:
    bench = load_bench_script("read_passages")
    speech = np.concatenate([np.zeros(SR, np.float32), tone(2.0), np.zeros(SR, np.float32)])
    quieter = bench.degrade(speech, np.random.default_rng(1), level_db=-20.0)
    assert np.abs(quieter).max() == pytest.approx(0.05, rel=1e-3)
    noisy = bench.degrade(speech, np.random.default_rng(1), level_db=-20.0, snr_db=20.0)
    noise = noisy - quieter
    speech_power = float(np.mean(np.square(quieter[SR: 3 * SR])))
    snr = 10 * np.log10(speech_power / float(np.mean(np.square(noise))))
    assert snr == pytest.approx(20.0, abs=0.5)
    assert np.abs(noisy[: SR // 2]).max() > 0  # the pauses hold the noise too
