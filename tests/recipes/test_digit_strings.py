"""Digit strings spoken one digit at a time: trimming, joining, planning, and the stage on espeak."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from recipes.digit_strings import (
    DigitStringConfig,
    join_digits,
    make_digit_strings,
    plan_strings,
    trim_silence,
)
from recipes.text import DIGIT_WORDS

RATE = 16000


def burst(seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def test_trim_silence_keeps_the_speech_and_a_margin() -> None:
    quiet = np.full(int(0.5 * RATE), 1e-5, np.float32)
    samples = np.concatenate([quiet, burst(0.3), quiet])
    out = trim_silence(samples, RATE, margin_s=0.03)
    assert abs(len(out) - int((0.3 + 0.06) * RATE)) <= 2 * RATE // 100  # frame rounding
    assert np.abs(out).max() == pytest.approx(0.5, abs=1e-3)
    silent = np.zeros(RATE, np.float32)
    assert trim_silence(silent, RATE) is silent  # nothing to find: unchanged


def test_join_digits_places_gaps_and_gains() -> None:
    a, b, c = burst(0.1), burst(0.2), burst(0.05)
    out = join_digits([a, b, c], [0.25, 0.0], [0.0, -6.0, 6.0])
    assert len(out) == len(a) + int(0.25 * RATE) + len(b) + len(c)
    gap = out[len(a):len(a) + int(0.25 * RATE)]
    assert not gap.any()
    second = out[len(a) + len(gap):len(a) + len(gap) + len(b)]
    assert np.abs(second).max() == pytest.approx(0.5 * 10 ** (-6 / 20), rel=1e-3)
    with pytest.raises(ValueError, match="gaps"):
        join_digits([a, b], [0.1, 0.1], [0.0, 0.0])


def test_plan_is_seeded_in_range_and_avoids_test_transcripts() -> None:
    cfg = DigitStringConfig(num_voices=5, num_strings=300, min_digits=3, max_digits=3)
    first = plan_strings(cfg, set())
    assert first == plan_strings(cfg, set())
    for item in first:
        assert len(item.digits) == 3 and len(item.gaps_s) == 2 and len(item.gains_db) == 3
        assert 0 <= item.voice_index < 5
        assert all(cfg.min_gap_s <= g <= cfg.max_gap_s for g in item.gaps_s)
        assert item.text.split() == [DIGIT_WORDS[d] for d in item.digits]
    banned = {first[0].text, first[1].text}
    assert not banned & {item.text for item in plan_strings(cfg, banned)}
    with pytest.raises(ValueError):
        DigitStringConfig(min_digits=5, max_digits=4)


@pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("sox") is None,
                    reason="needs espeak-ng and sox")
def test_stage_writes_wavs_and_a_manifest(tmp_path: Path, monkeypatch) -> None:
    from recipes import digit_strings
    from recipes.voices import Voice

    monkeypatch.setattr(digit_strings, "bank_voices",
                        lambda cfg: [Voice("espeak", "en-us+m1")] * cfg.num_voices)
    cfg = DigitStringConfig(num_voices=2, num_strings=3, min_digits=2, max_digits=4, num_workers=1)
    audio_root = tmp_path / "audio"
    audio_root.mkdir()
    n, hours = make_digit_strings(tmp_path / "data", cfg, audio_root)
    rows = (tmp_path / "data/manifests/train_digits.tsv").read_text().splitlines()
    assert n == len(rows) == 3 and hours > 0
    for row in rows:
        uid, path, secs, voice, text = row.split("\t")
        samples, rate = sf.read(path)
        assert rate == RATE and voice == "espeak:en-us+m1"
        assert 2 <= len(text.split()) <= 4
        assert len(samples) / RATE == pytest.approx(float(secs), abs=1e-3)
        assert float(secs) >= 0.2 * len(text.split())  # each isolated digit lasts >= 0.2 s
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "data/wav/train_digits").iterdir()}
    make_digit_strings(tmp_path / "data", cfg, audio_root)  # resumes: nothing redone
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "data/wav/train_digits").iterdir()}
