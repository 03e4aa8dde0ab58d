"""BufferedFeatures: an incremental extractor's frames as the windower's frame store."""

from __future__ import annotations

import numpy as np
import pytest
from support.log_mel_calls import count_log_mel_batches

from oasr.audio import (
    BufferedFeatures,
    ChunkGeometry,
    ChunkWindower,
    StreamingFbank,
    accept_waveforms,
)
from oasr.models.whisper_ctc import CausalLogMel, causal_log_mel
from oasr.models.whisper_ctc.frontend import LogMelSpectra

WHISPER_GEOMETRY = ChunkGeometry(chunk_size=4, subsampling=2, right_context=1)


def _samples(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)


def test_pieces_then_finish_equal_the_whole_utterance() -> None:
    samples = _samples(16000 + 77)
    features = BufferedFeatures(CausalLogMel(80), 80)
    rng = np.random.default_rng(1)
    pos = 0
    while pos < len(samples):
        n = int(rng.integers(0, 3000))
        features.accept_waveform(samples[pos : pos + n])
        pos += n
    features.input_finished()
    want = causal_log_mel(samples)
    assert features.num_frames_ready == len(want) == len(samples) // 160 + 1
    np.testing.assert_allclose(features.get_frames(0, features.num_frames_ready), want, atol=1e-5)


def test_windows_are_plain_pairs_of_chunk_frames_and_cover_every_frame() -> None:
    samples = _samples(5400)  # 33 frames before the end (4 windows of 8), 34 after
    features = BufferedFeatures(CausalLogMel(80), 80)
    windower = ChunkWindower(WHISPER_GEOMETRY)
    features.accept_waveform(samples)
    windows = []
    while (window := windower.pop_window(features)) is not None:
        windows.append(window)
    assert [w.num_frames for w in windows] == [8, 8, 8, 8]  # the last one waits for the end
    assert features.num_frames_retained < 8  # taken frames are dropped
    features.input_finished()
    windows.append(windower.pop_window(features))
    assert windower.is_exhausted(features)
    assert [w.num_output_frames for w in windows] == [4, 4, 4, 4, 1]
    assert [w.start_frame for w in windows] == [0, 8, 16, 24, 32]
    np.testing.assert_allclose(np.concatenate([w.feats for w in windows]),
                               causal_log_mel(samples), atol=1e-5)


def test_dropped_and_future_frames_are_refused() -> None:
    features = BufferedFeatures(CausalLogMel(80), 80)
    features.accept_waveform(_samples(3200))
    ready = features.num_frames_ready
    first = features.get_frames(0, 4)
    features.drop_frames_before(2)
    np.testing.assert_array_equal(features.get_frames(2, 4), first[2:])
    assert features.num_frames_retained == ready - 2
    with pytest.raises(IndexError, match=r"retained are \[2, "):
        features.get_frames(1, 3)
    with pytest.raises(IndexError, match="not available"):
        features.get_frames(2, ready + 1)
    with pytest.raises(IndexError, match=f"only {ready} are ready"):
        features.drop_frames_before(ready + 1)


def test_bad_samples_and_audio_after_the_end_are_refused() -> None:
    features = BufferedFeatures(CausalLogMel(80), 80)
    with pytest.raises(ValueError, match="1-D float32"):
        features.accept_waveform(np.zeros(10, dtype=np.float64))
    features.input_finished()
    with pytest.raises(RuntimeError, match="after input_finished"):
        features.accept_waveform(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError, match="twice"):
        features.input_finished()


def test_an_extractor_of_the_wrong_width_is_caught() -> None:
    features = BufferedFeatures(CausalLogMel(80), 64)
    with pytest.raises(ValueError, match=r"expected \(F, 64\)"):
        features.accept_waveform(_samples(1600))


def test_many_streams_are_fed_in_one_batch_and_a_bad_one_fails_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_log_mel_batches(monkeypatch)
    shared = LogMelSpectra(80)  # an engine's streams share one
    sources = [BufferedFeatures(CausalLogMel(80, shared), 80) for _ in range(4)]
    sources[2].input_finished()  # audio after the end: refused, for this stream only
    audio = [_samples(3200, seed) for seed in range(4)]
    audio[1] = audio[1].astype(np.float64)  # not float32: refused, for this stream only
    errors = accept_waveforms(sources, audio)
    assert calls == [2]  # streams 0 and 3 together
    assert errors[0] is None and errors[3] is None
    assert isinstance(errors[1], ValueError) and isinstance(errors[2], RuntimeError)
    for i in (0, 3):
        assert sources[i].num_samples_accepted == 3200
        assert sources[i].num_frames_ready == (3200 - 200) // 160 + 1
        np.testing.assert_allclose(sources[i].get_frames(0, sources[i].num_frames_ready),
                                   causal_log_mel(audio[i])[:sources[i].num_frames_ready],
                                   atol=1e-5)
    assert sources[1].num_samples_accepted == 0


def test_a_failing_batch_fails_its_streams_and_others_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cls: type, extractors: list[CausalLogMel], samples: list[np.ndarray]) -> list:
        raise MemoryError("no room for the spectra")

    monkeypatch.setattr(CausalLogMel, "accept_many", classmethod(broken))
    fbank = StreamingFbank()  # no batched extractor: fed on its own
    sources = [BufferedFeatures(CausalLogMel(80), 80), fbank]
    errors = accept_waveforms(sources, [_samples(3200), _samples(3200)])
    assert isinstance(errors[0], MemoryError) and errors[1] is None
    assert fbank.num_samples_accepted == 3200


def test_frames_read_back_as_appended_through_growth_drops_and_compaction() -> None:
    """Pieces of random sizes appended, random prefixes dropped and random ranges read, as a
    windower and a backlog do: every read is the frames appended there, while the buffer
    grows, moves its retained rows to the front and shrinks after a long backlog is read."""

    class Counting:  # an extractor whose frame i holds i in every column
        def __init__(self) -> None:
            self.made = 0

        def accept(self, samples: np.ndarray) -> np.ndarray:
            rows = np.arange(self.made, self.made + len(samples), dtype=np.float32)
            self.made += len(samples)
            return np.repeat(rows[:, None], 3, axis=1)

        def flush(self) -> np.ndarray:
            return np.zeros((0, 3), np.float32)

    features = BufferedFeatures(Counting(), 3)  # type: ignore[arg-type]
    rng = np.random.default_rng(4)
    sizes = set()
    for step in range(400):
        backlog = 200 <= step < 220  # frames pile up unread, then are read and dropped
        features.accept_waveform(np.zeros(int(rng.integers(0, 40 if not backlog else 400)),
                                          np.float32))
        sizes.add(len(features._frames))
        lo, hi = features.num_frames_dropped, features.num_frames_ready
        if hi > lo:
            a = int(rng.integers(lo, hi))
            b = int(rng.integers(a, hi + 1))
            np.testing.assert_array_equal(features.get_frames(a, b)[:, 1], np.arange(a, b))
            if not backlog:
                features.drop_frames_before(max(lo, hi - int(rng.integers(0, 60))))
    assert len(sizes) > 3  # it grew (and shrank after the backlog)
    assert len(features._frames) < max(sizes) // 2
