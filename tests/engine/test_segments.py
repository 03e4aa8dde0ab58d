"""Segments follow speech: the bundled model's endpoints on real read speech fall in the
sentence pauses, a long sentence is cut at its quietest point, and the frames after a cut in
the past are decoded again (no audio lost)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support.paths import DEVSET_DIR

from oasr.audio import read_audio
from oasr.decoding import EndpointConfig, EndpointRule
from oasr.engine import ASREngine, EngineConfig, Final, Partial
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.live.policy import SegmentEnd

SR = 16000
SS = "real_sense_and_sensibility_01_austen_64kb-0{}.wav"

pytestmark = pytest.mark.slow


def passage(parts: list[str | float]) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Recordings (names) and pauses (seconds) joined; the (start, end) of each pause."""
    pieces, gaps, t = [np.zeros(int(0.3 * SR), np.float32)], [], 0.3
    for part in parts:
        if isinstance(part, str):
            clip = read_audio(DEVSET_DIR / part)
        else:
            clip = np.zeros(int(part * SR), np.float32)
            gaps.append((t, t + part))
        pieces.append(clip)
        t += len(clip) / SR
    return np.concatenate(pieces), gaps


def segments(audio: np.ndarray, endpoint: EndpointConfig) -> list[tuple[str, float]]:
    """Each final's text and the stream time (s) where its segment was cut."""
    engine = ASREngine(EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1,
                                    endpoint=endpoint))
    finals: list[tuple[str, float]] = []

    def sink(event) -> None:
        if isinstance(event, Final):
            request = engine.requests.get(1)
            cut = request.num_frames_decoded * 0.02 if request is not None else -1.0
            finals.append((event.text, cut))

    engine.submit(OpenStream(1, sink))
    engine.submit(AppendAudio(1, audio))
    engine.submit(EndStream(1))
    for _ in range(10_000):
        engine.step()
        if not engine.requests:
            break
    return finals


def test_a_read_passage_is_cut_at_its_sentence_pauses() -> None:
    audio, gaps = passage([SS.format(870), 1.0, SS.format(930), 0.9, SS.format(880)])
    got = segments(audio, EndpointConfig())
    cuts = [cut for _, cut in got[:-1]]  # the last final ends with the stream
    assert len(got) == 3, got
    for lo, hi in gaps:
        assert any(lo < cut <= hi for cut in cuts), (lo, hi, got)
    assert "dash" in got[0][0] and "miable" in got[1][0] and "man" in got[2][0], got


@pytest.mark.parametrize("rules", ["sentence_pauses", "default"])
def test_a_long_sentence_is_cut_at_its_quietest_point_and_nothing_is_lost(rules: str) -> None:
    # clips joined by 0.35 s breaths, longer than the longest segment; only the length rule
    # may cut: at 15 s with the sentence-pause rules, at 20 s by default (WeNet's 1 s rule)
    if rules == "default":  # ~26 s; the chunk that passes 20 s ends in a word (20.5 s)
        endpoint, limit = EngineConfig().endpoint, 20.0
        clips = [SS.format(n) for n in (870, 890, 920, 880, 930)]
    else:  # ~19 s
        endpoint, limit = EndpointConfig(rule2=None, rule4=None), 15.0
        clips = [SS.format(n) for n in (870, 880, 890, 930)]
    assert endpoint is not None
    audio, gaps = passage([part for clip in clips for part in (clip, 0.35)][:-1])
    got = segments(audio, endpoint)
    assert len(got) == 2, got
    assert endpoint.rule3 is not None and endpoint.rule3.min_utterance_length_s == limit
    cut = got[0][1]
    # within the 3 s before the chunk (0.64 s) at which the limit was passed
    assert limit - 3.0 <= cut <= limit + 0.64, got
    # in a pause: the audio around the cut is far below speech (-15 to -30 dB here)
    around = audio[int((cut - 0.06) * SR): int((cut + 0.06) * SR)]
    assert 10 * np.log10(np.mean(around.astype(np.float64) ** 2)) < -38.0, cut
    # the frames after the cut were decoded again: the words on both sides are all there
    whole = segments(audio, EndpointConfig(rule2=None, rule3=None, rule4=None))
    assert len(whole) == 1
    joined = " ".join(text for text, _ in got).split()
    assert abs(len(joined) - len(whole[0][0].split())) <= 2, (got, whole)


def test_no_text_before_speech_on_leading_silence_and_low_noise() -> None:
    rng = np.random.default_rng(0)
    white = rng.standard_normal(2 * SR)
    spectrum = np.fft.rfft(rng.standard_normal(2 * SR))
    spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))  # pink
    pink = np.fft.irfft(spectrum, 2 * SR)
    lead = np.concatenate([np.zeros(SR), 10 ** (-60 / 20) * white,
                           10 ** (-50 / 20) * pink / pink.std()]).astype(np.float32)
    speech = read_audio(DEVSET_DIR / SS.format(880))
    engine = ASREngine(EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1))
    texts: list[tuple[float, str]] = []
    engine.submit(OpenStream(1, lambda e: texts.append(
        (engine.requests[1].num_frames_decoded * 0.02 if 1 in engine.requests else 99.0, e.text))
        if isinstance(e, (Partial, Final)) else None))
    engine.submit(AppendAudio(1, np.concatenate([lead, speech])))
    engine.submit(EndStream(1))
    engine.step()
    while engine.requests:
        engine.step()
    lead_s = len(lead) / SR
    assert texts, "the speech was not transcribed"
    assert all(t > lead_s for t, _ in texts), texts  # nothing emitted during the lead
    assert texts[0][1].startswith("he"), texts


def _espeak(text: str) -> np.ndarray:
    """``text`` read by espeak-ng (en-us), 16 kHz, trimmed to its speech."""
    import subprocess
    import tempfile

    from oasr.audio import read_audio as read

    with tempfile.TemporaryDirectory() as tmp:
        wav = f"{tmp}/say.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "165", "-w", wav, text], check=True)
        audio = read(wav)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0]: loud[-1] + 1]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_a_last_word_after_a_pause_stays_in_its_sentence() -> None:
    # "... degree of comparison" [0.9 s] "only." [1.0 s] "It was the year ...": the pause
    # before "only" is as long as a sentence pause, but one word then a pause keeps it
    parts = [_espeak(t) for t in ("in the superlative degree of comparison", "only",
                                  "it was the year of our lord one thousand seven hundred")]
    gap = [np.zeros(int(s * SR), np.float32) for s in (0.3, 0.9, 1.0, 0.5)]
    audio = np.concatenate([gap[0], parts[0], gap[1], parts[1], gap[2], parts[2], gap[3]])
    kept = segments(audio, EndpointConfig())
    assert len(kept) == 2, kept
    assert "nly" in kept[0][0].split()[-1] and kept[1][0].startswith("it"), kept
    cut_at_once = segments(audio, EndpointConfig(tail_words=0))
    assert "nly" not in cut_at_once[0][0], cut_at_once  # what tail_words prevents


def test_a_segment_ended_before_noise_keeps_its_words_and_drops_the_tokens_after_them() -> None:
    # `FinalPublisher.end_before_noise`: the segment ends where the later early decode
    # started (frame 130), its final's tokens only those before the kept decode's audio
    # (frame 100): the CTC pass's tokens in between were no words; the next segment is
    # decoded from the cut
    audio, _ = passage([SS.format(880), 0.3, SS.format(890)])
    engine = ASREngine(EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1,
                                    endpoint=EndpointConfig(rule2=None, rule3=None, rule4=None)))
    finals: list[Final] = []
    engine.submit(OpenStream(1, lambda e: finals.append(e) if isinstance(e, Final) else None))
    engine.submit(AppendAudio(1, audio))
    for _ in range(1_000):
        engine.step()
        request = engine.requests[1]
        if request.segment_frames >= 160:
            break
    whole = engine.resources.final_hypothesis(1)
    assert sum(t >= 100 for t in whole.timestamps) >= 3  # words after frame 100 to drop
    engine._end_segment(request, SegmentEnd("test", cut_frame=130, words_to=100))
    (first,) = finals
    assert first.end <= 100 * 0.02 and first.text
    assert whole.text.startswith(first.text)
    assert request.segment_start_frame == 130 and request.num_frames_decoded == 130
    engine.submit(EndStream(1))
    for _ in range(10_000):
        engine.step()
        if not engine.requests:
            break
    assert len(finals) == 2 and finals[1].start >= 130 * 0.02


@pytest.mark.parametrize("silence_s", [1.0, 6.0])
def test_a_trailing_pause_ends_inside_the_pause_and_the_next_sentence_keeps_its_words(
        silence_s: float) -> None:
    """A silence rule fires at a chunk's end, after the pause: the segment ends inside the
    pause's audio (never in the next sentence's first sound), however long the rule's silence
    (a client may ask for up to 60 s: a cut cannot reach back further than the frames the
    stream keeps to decode again), and the two segments hold every word."""
    gap = silence_s + 0.7
    audio, gaps = passage([SS.format(870), gap, SS.format(880)])
    rule = EndpointRule(must_contain_speech=True, min_trailing_silence_s=silence_s)
    endpoint = EndpointConfig(rule1=None, rule2=rule, rule4=None)
    got = segments(audio, endpoint)
    assert len(got) == 2, got
    (lo, hi), cut = gaps[0], got[0][1]
    assert lo < cut <= hi, (lo, hi, got)
    whole = segments(audio, EndpointConfig(rule1=None, rule2=None, rule3=None, rule4=None))
    joined = " ".join(text for text, _ in got).split()
    assert abs(len(joined) - len(whole[0][0].split())) <= 1, (got, whole)
    assert got[1][0].split()[0] == "he", got  # "He was not ...": its first sound kept
