"""The causal log-mel: pieces == whole, causality of the running-maximum floor, frame count,
and Whisper's own log-mel values where only the padding could differ."""

import threading

import numpy as np
import pytest
import torch

from oasr.models.whisper import WhisperFrontend
from oasr.models.whisper_ctc import CausalLogMel, causal_log_mel


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(16000 * seconds)
    t = np.arange(n) / 16000
    tone = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_pieces_then_flush_equal_the_whole(seed: int) -> None:
    audio = speechlike(2.3, seed)
    whole = causal_log_mel(audio)
    rng = np.random.default_rng(seed + 10)
    stream, parts, i = CausalLogMel(), [], 0
    while i < len(audio):
        n = int(rng.integers(1, 2500))
        parts.append(stream.accept(audio[i:i + n]))
        i += n
    parts.append(stream.flush())
    pieces = np.concatenate(parts)
    assert pieces.shape == whole.shape == (len(audio) // 160 + 1, 80)
    np.testing.assert_allclose(pieces, whole, atol=1e-5)


def test_a_frame_is_emitted_once_its_window_is_complete() -> None:
    stream = CausalLogMel()
    assert stream.accept(np.zeros(199, np.float32)).shape == (0, 80)
    assert stream.accept(np.zeros(1, np.float32)).shape == (1, 80)  # frame 0 needs 200
    assert stream.accept(np.zeros(159, np.float32)).shape == (0, 80)
    assert stream.accept(np.zeros(1, np.float32)).shape == (1, 80)  # frame 1 needs 360
    assert stream.flush().shape == (1, 80)  # 360 samples: frames 0..2 in all
    stream.reset()
    assert stream.num_frames == 0 and stream.flush().shape == (0, 80)


def test_later_audio_never_changes_earlier_frames() -> None:
    quiet = 0.01 * speechlike(1.0)
    loud = np.concatenate([quiet, 30 * quiet])  # a louder second half raises the maximum
    short, long = causal_log_mel(quiet), causal_log_mel(loud)
    complete = (len(quiet) - 200) // 160 + 1  # frames whose window ends inside ``quiet``
    np.testing.assert_allclose(long[:complete], short[:complete], atol=1e-6)
    assert long.max() > short.max() + 0.5


def test_the_floor_is_the_running_maximum_minus_eight() -> None:
    tone = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(8000) / 16000)
    audio = np.concatenate([np.zeros(1600), tone]).astype(np.float32)
    feats = causal_log_mel(audio)
    silent = (-10.0 + 4.0) / 4.0  # log10(1e-10) before any louder frame
    assert np.all(feats[:4] == pytest.approx(silent))
    peak = np.maximum.accumulate(feats.max(axis=1))
    assert np.all(feats >= peak[:, None] - 2.0 - 1e-6)  # 8 in log10 units is 2 after /4
    assert np.any(np.isclose(feats[-10:], peak[-10:, None] - 2.0, atol=1e-6))


def test_matches_whisper_log_mel_away_from_the_first_frames() -> None:
    """Whisper's frontend reflect-pads the start (frames 0-1 differ) and floors at the window's
    maximum; with a dynamic range under 8 the floor binds in neither, so the rest is equal."""
    audio = speechlike(3.0)
    ours = causal_log_mel(audio)  # (301, 80)
    theirs = WhisperFrontend()([audio])[0].T.numpy()[: len(ours)]  # (301, 80)
    np.testing.assert_allclose(ours[2:], theirs[2:], atol=2e-5)
    assert np.abs(ours[0] - theirs[0]).max() > 1e-3  # the padding differs at the start


def test_many_streams_at_once_give_each_streams_own_frames() -> None:
    """`accept_many` (one FFT and one product for every stream of a step) equals each stream
    fed alone, whatever each stream's length, position and loudness so far."""
    audio = [speechlike(1.7, seed) * gain for seed, gain in enumerate((1.0, 0.01, 3.0, 0.3))]
    alone = [CausalLogMel() for _ in audio]
    together = [CausalLogMel() for _ in audio]
    rng = np.random.default_rng(7)
    position = [0] * len(audio)
    while any(p < len(a) for p, a in zip(position, audio, strict=True)):
        pieces = []
        for i, samples in enumerate(audio):
            n = int(rng.integers(0, 3000))
            pieces.append(samples[position[i]:position[i] + n])
            position[i] += n
        want = [stream.accept(piece) for stream, piece in zip(alone, pieces, strict=True)]
        got = CausalLogMel.accept_many(together, pieces)
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, atol=1e-6)
    for a, t in zip(alone, together, strict=True):
        np.testing.assert_allclose(t.flush(), a.flush(), atol=1e-6)


def test_streams_sharing_one_spectra_are_one_product_and_others_their_own() -> None:
    from oasr.models.whisper_ctc.frontend import LogMelSpectra

    shared = LogMelSpectra(80)
    streams = [CausalLogMel(80, shared), CausalLogMel(80, shared), CausalLogMel(80)]
    calls: list[int] = []
    for spectra in {id(s._spectra): s._spectra for s in streams}.values():
        log_mel = spectra.log_mel
        spectra.log_mel = lambda rows, f=log_mel: calls.append(len(rows)) or f(rows)  # type: ignore[method-assign]
    audio = speechlike(0.5)
    frames = CausalLogMel.accept_many(streams, [audio, audio, audio])
    assert sorted(calls) == [1, 2]
    for f in frames[1:]:
        np.testing.assert_allclose(f, frames[0], atol=1e-6)
    with pytest.raises(ValueError, match="80 mels"):
        CausalLogMel(64, shared)


def _floor_row_by_row(rows: np.ndarray, before: float) -> tuple[np.ndarray, float]:
    """The floor's definition, one frame at a time: the running maximum including the frame
    (a NaN stays), the frame floored at it minus 8, then (x + 4) / 4, all in float32."""
    peak, out = np.float32(before), []
    for row in rows:
        peak = np.maximum(peak, row.max())
        out.append(((np.maximum(row, peak - 8.0) + 4.0) / 4.0).astype(np.float32))
    return np.stack(out), float(peak)


def test_the_floors_of_many_streams_at_once_equal_each_streams_own_bit_for_bit() -> None:
    """`_apply_floors` (every stream of a step in a few array operations) gives each stream
    the values and running maximum its frames give one at a time, whatever its row count,
    running maximum so far (none yet, or above all its rows), or a NaN in its rows, which
    stays that stream's own."""
    from oasr.models.whisper_ctc.frontend import _apply_floors

    rng = np.random.default_rng(3)
    counts = [5, 1, 5, 12, 5, 3]
    running = [-np.inf, 0.7, -2.0, 9.5, -np.inf, 1.25]
    log_mel = rng.uniform(-10.0, 4.0, (sum(counts), 80)).astype(np.float32)
    log_mel[7, 3] = np.nan  # the third stream's second row
    got, maxima = _apply_floors(log_mel.copy(), counts, running)  # (it writes over its input)
    start = 0
    for count, before, new_max in zip(counts, running, maxima, strict=True):
        want, want_max = _floor_row_by_row(log_mel[start:start + count], before)
        np.testing.assert_array_equal(got[start:start + count], want)
        assert new_max == want_max or (np.isnan(new_max) and np.isnan(want_max))
        start += count
    assert got.dtype == np.float32 and np.isnan(maxima[2]) and not np.isnan(maxima[3])


def test_the_frames_buffer_is_reused_across_calls_and_kept_per_thread() -> None:
    from oasr.models.whisper_ctc.frontend import LogMelSpectra

    spectra = LogMelSpectra(80)
    windows = [np.lib.stride_tricks.sliding_window_view(speechlike(0.3, s), 400)[::160]
               for s in range(3)]
    pieces = [torch.from_numpy(np.ascontiguousarray(w)) for w in windows]
    first = spectra.log_mel(pieces).clone()
    buffer = spectra._frames.buffer
    again = spectra.log_mel(pieces[:2])  # fewer rows: the same buffer
    assert spectra._frames.buffer is buffer
    # (the same rows: equal up to how many rows shared the product)
    torch.testing.assert_close(again, first[:len(pieces[0]) + len(pieces[1])], rtol=0,
                               atol=1e-5)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(
        (spectra.log_mel(pieces), spectra._frames.buffer)))
    thread.start()
    thread.join()
    torch.testing.assert_close(seen[0][0], first, rtol=0, atol=0)
    assert seen[0][1] is not buffer  # another thread's own
    assert spectra.log_mel([torch.zeros((0, 400))]).shape == (0, 80)
