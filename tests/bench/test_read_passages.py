"""bench/read_passages.py's stress variant: pauses paced as asked, speech re-levelled and
mixed with noise at the asked signal-to-noise ratio."""

from __future__ import annotations

import numpy as np
import pytest
from support.bench_scripts import load_bench_script

from oasr.audio import MODEL_SAMPLE_RATE as SR


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


def test_applause_fills_the_sentence_pauses_but_the_last_below_the_speech() -> None:
    bench = load_bench_script("read_passages")
    sentences = [[tone(0.5)], [tone(0.6)], [tone(0.4)]]
    audio, spans = bench.join(sentences, np.random.default_rng(2), with_applause=True)
    plain, plain_spans = bench.join(sentences, np.random.default_rng(2))
    speech_db = 10 * np.log10(np.mean(np.square(tone(0.5).astype(np.float64))))
    gap_s, burst_s = bench.APPLAUSE_GAP_S, bench.APPLAUSE_S
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        skip = int(0.002 * SR)  # the span's end is rounded to the millisecond
        pause = audio[int(end * SR) + skip: int(start * SR) - skip].astype(np.float64)
        loud = (np.flatnonzero(np.abs(pause) > 1e-4) + skip) / SR
        # the burst starts after a short silence and lasts as asked
        assert gap_s[0] - 0.01 <= loud[0] <= gap_s[1] + 0.01
        assert burst_s[0] - 0.25 <= loud[-1] - loud[0] <= burst_s[1]
        burst = pause[int(loud[0] * SR) - skip: int(loud[-1] * SR) - skip]
        level = 10 * np.log10(np.mean(np.square(burst)))
        below = speech_db - level
        assert bench.APPLAUSE_BELOW_DB[0] - 1 <= below <= bench.APPLAUSE_BELOW_DB[1] + 1
        # then a sentence pause of silence before the next sentence
        assert start - end - loud[-1] >= bench.PACINGS["read"][1][0] - 0.01
    last_end = spans[-1][1]
    assert not np.abs(audio[int(last_end * SR) + 32:]).any()  # none after the last sentence
    assert len(plain_spans) == len(spans) and len(audio) > len(plain)


def test_applause_is_claps_not_a_steady_noise() -> None:
    bench = load_bench_script("read_passages")
    burst = bench.applause(np.random.default_rng(3), 1.5).astype(np.float64)
    assert len(burst) == int(1.5 * SR)
    assert np.sqrt(np.mean(np.square(burst))) == pytest.approx(1.0, rel=1e-3)
    # claps: the 10 ms frames' energies spread far more than steady noise's do
    frames = burst[: len(burst) // 160 * 160].reshape(-1, 160)
    db = 10 * np.log10(np.mean(np.square(frames), axis=1) + 1e-12)
    middle = db[20:-20]  # the fades aside
    assert np.percentile(middle, 90) - np.percentile(middle, 10) > 6.0


def room_recording(speech_s: float, room_s: float, room_db: float = -45.0) -> np.ndarray:
    """A tone (the words) with room tone after it (noise ``room_db`` dB full scale): a real
    recording's tail, which a -40 dB trim keeps whole."""
    room = np.random.default_rng(3).standard_normal(int(room_s * SR)) * 10 ** (room_db / 20)
    return np.concatenate([tone(speech_s), room.astype(np.float32)])


def test_a_sentences_end_leaves_out_the_recordings_room_tone() -> None:
    bench = load_bench_script("read_passages")
    clip = room_recording(1.0, 0.4)  # the tone peaks near -9 dB: room tone is within 40 dB
    assert len(bench.trim(clip)) == len(clip)  # the trim keeps the room tone
    assert bench.room_tail(clip) == pytest.approx(0.4, abs=0.011)  # (it ends the recording)
    silent = np.concatenate([tone(1.0), np.zeros(SR // 2, np.float32)])
    assert bench.room_tail(silent) == pytest.approx(0.03, abs=1e-3)  # a voice's digital silence
    assert bench.room_tail(tone(1.0)) == 0.0  # no quieter part: no floor to tell words from
    # the span ends where the words did; the audio is the same as without tails
    rng = np.random.default_rng(0)
    audio, spans = bench.join([[clip], [clip]], rng, tails=[0.4, 0.4])
    plain, plain_spans = bench.join([[clip], [clip]], np.random.default_rng(0))
    assert np.array_equal(audio, plain)
    assert [b for _, b in spans] == pytest.approx([b - 0.4 for _, b in plain_spans], abs=1e-3)


def _db(audio: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(audio.astype(np.float64)))))


def _low_share(audio: np.ndarray) -> float:
    """The share of ``audio``'s power below 500 Hz."""
    power = np.abs(np.fft.rfft(audio.astype(np.float64))) ** 2
    return float(power[: len(power) * 500 // (SR // 2)].sum() / power.sum())


def test_a_recordings_pauses_hold_its_room_tone_not_digital_silence() -> None:
    bench = load_bench_script("read_passages")
    rng = np.random.default_rng(5)
    # a room that hisses: noise high-passed (a first difference), -45 dB, after the words
    hiss = np.diff(rng.standard_normal(SR + 1))
    hiss *= 10 ** (-45 / 20) / np.sqrt(np.mean(hiss ** 2))
    clip = np.concatenate([tone(1.0), hiss.astype(np.float32)])
    room = bench.room_of(clip)
    assert room is not None and _db(room) == pytest.approx(-45.0, abs=1.0)
    assert bench.room_of(np.concatenate([tone(1.0), np.zeros(SR, np.float32)])) is None
    quieter = clip[SR:] * np.float32(10 ** (-5 / 20))  # a second room, 5 dB quieter
    sentences = [[tone(0.5), tone(0.4)], [tone(0.6)]]
    audio, spans = bench.join(sentences, np.random.default_rng(0),
                              rooms=[room, bench.room_of(np.concatenate([tone(1.0), quieter]))])
    plain, plain_spans = bench.join(sentences, np.random.default_rng(0))
    # the pauses' lengths and the sentences' spans do not depend on the room
    assert len(audio) == len(plain) and spans == plain_spans
    (a0, a1), (b0, b1) = spans
    lead, breath = audio[: int(0.45 * SR)], audio[int((a0 + 0.52) * SR): int((a0 + 0.68) * SR)]
    pause, after = audio[int((a1 + 0.02) * SR): int((b0 - 0.02) * SR)], audio[int((b1 + 0.02) * SR):]
    for part in (lead, breath, pause):  # the first sentence's room, at its level
        assert _db(part) == pytest.approx(-45.0, abs=1.5)
    assert _db(after) == pytest.approx(-50.0, abs=1.5)  # the room of the sentence before it
    # and its colour: as little of the power below 500 Hz as the room has (white noise has
    # 6 %, pink noise 72 %)
    assert _low_share(room) < 0.01
    assert _low_share(pause) == pytest.approx(_low_share(room), abs=0.03)
    assert not np.any(plain[: int(0.45 * SR)])  # without rooms: digital silence
    # the clips themselves are untouched
    inside = slice(int(b0 * SR) + 16, int(b1 * SR) - 16)  # (the spans are rounded to 1 ms)
    assert np.array_equal(audio[inside], plain[inside])
