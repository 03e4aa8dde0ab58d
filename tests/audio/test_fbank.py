import numpy as np
import pytest

from oasr.audio import FbankConfig, StreamingFbank, compute_fbank, read_audio


def _stream_fbank(samples, rng, max_piece=3000):
    fbank = StreamingFbank()
    i = 0
    while i < samples.shape[0]:
        n = int(rng.integers(0, max_piece))
        fbank.accept_waveform(samples[i : i + n])
        i += n
    fbank.input_finished()
    return fbank


def test_matches_wenet_kaldi_fbank_fixture(wenet_reference):
    wav = wenet_reference["wav_int16"].astype(np.float32) / 32768.0
    feats = compute_fbank(wav)
    expected = wenet_reference["feats"]
    assert feats.shape == expected.shape == (512, 80)
    assert feats.dtype == np.float32
    diff = np.abs(feats - expected)
    assert diff.max() < 1e-2
    assert diff.mean() < 1e-4


def test_unscaled_or_dithered_features_miss_the_fixture(wenet_reference):
    # The fixture pins the int16 scaling and dither 0: changing either is caught.
    wav = wenet_reference["wav_int16"].astype(np.float32) / 32768.0
    unscaled = compute_fbank(wav, FbankConfig(input_scale=1.0))
    assert np.abs(unscaled - wenet_reference["feats"]).max() > 1.0
    dithered = compute_fbank(wav, FbankConfig(dither=1.0))
    assert np.abs(dithered - wenet_reference["feats"]).max() > 1e-2


def test_streamed_in_random_pieces_equals_one_shot_exactly(wenet_reference):
    wav = wenet_reference["wav_int16"].astype(np.float32) / 32768.0
    fbank = _stream_fbank(wav, np.random.default_rng(0))
    np.testing.assert_array_equal(fbank.get_frames(0, fbank.num_frames_ready), compute_fbank(wav))


def test_devset_streamed_equals_one_shot(devset_wavs):
    rng = np.random.default_rng(1)
    for path in devset_wavs[:3]:
        wav = read_audio(path)
        fbank = _stream_fbank(wav, rng, max_piece=1000)
        offline = compute_fbank(wav)
        assert offline.shape == (FbankConfig().num_frames(wav.shape[0]), 80)
        np.testing.assert_array_equal(fbank.get_frames(0, fbank.num_frames_ready), offline)


@pytest.mark.parametrize(
    ("num_samples", "num_frames"), [(0, 0), (399, 0), (400, 1), (559, 1), (560, 2), (16000, 98)]
)
def test_frame_count_follows_snip_edges(num_samples, num_frames):
    wav = (0.1 * np.random.default_rng(2).standard_normal(num_samples)).astype(np.float32)
    assert FbankConfig().num_frames(num_samples) == num_frames
    assert compute_fbank(wav).shape == (num_frames, 80)


def test_frames_are_ready_as_soon_as_their_window_is_complete():
    fbank = StreamingFbank()
    fbank.accept_waveform(np.zeros(399, dtype=np.float32))
    assert fbank.num_frames_ready == 0
    fbank.accept_waveform(np.zeros(1, dtype=np.float32))
    assert fbank.num_frames_ready == 1
    fbank.accept_waveform(np.zeros(160 * 3, dtype=np.float32))
    assert fbank.num_frames_ready == 4
    assert fbank.num_samples_accepted == 880


def _filled(num_samples=16000):
    fbank = StreamingFbank()
    wav = (0.1 * np.random.default_rng(3).standard_normal(num_samples)).astype(np.float32)
    fbank.accept_waveform(wav)
    return fbank, compute_fbank(wav)


def test_get_frames_uses_absolute_indices_after_drop():
    fbank, offline = _filled()
    fbank.drop_frames_before(64)
    assert fbank.num_frames_dropped == 64
    assert fbank.num_frames_ready == 98 and fbank.num_frames_retained == 34
    np.testing.assert_array_equal(fbank.get_frames(64, 98), offline[64:98])
    # Overlapping reads return the same frames: nothing is recomputed or consumed.
    np.testing.assert_array_equal(fbank.get_frames(64, 67), offline[64:67])
    fbank.drop_frames_before(10)  # already dropped: no-op
    assert fbank.num_frames_dropped == 64


def test_get_frames_returns_a_copy():
    fbank, offline = _filled()
    frames = fbank.get_frames(0, 2)
    frames[:] = 0
    np.testing.assert_array_equal(fbank.get_frames(0, 2), offline[:2])


@pytest.mark.parametrize(("start", "end"), [(10, 20), (60, 99), (70, 65), (-1, 5)])
def test_get_frames_out_of_range_raises(start, end):
    fbank, _ = _filled()
    fbank.drop_frames_before(64)
    with pytest.raises(IndexError, match=r"retained are \[64, 98\)"):
        fbank.get_frames(start, end)


def test_drop_beyond_ready_raises():
    fbank, _ = _filled()
    with pytest.raises(IndexError, match="cannot drop frames before 99: only 98 are ready"):
        fbank.drop_frames_before(99)


def test_pop_frames_takes_oldest_in_order():
    fbank, offline = _filled()
    np.testing.assert_array_equal(fbank.pop_frames(30), offline[:30])
    np.testing.assert_array_equal(fbank.pop_frames(30), offline[30:60])
    assert fbank.num_frames_retained == 38
    with pytest.raises(IndexError):
        fbank.pop_frames(39)


def test_retained_frames_stay_bounded_on_a_long_stream():
    fbank = StreamingFbank()
    rng = np.random.default_rng(4)
    most_retained = 0
    for _ in range(200):  # 20 s in 100 ms pieces, consumer keeps up
        fbank.accept_waveform((0.1 * rng.standard_normal(1600)).astype(np.float32))
        most_retained = max(most_retained, fbank.num_frames_retained)
        fbank.drop_frames_before(fbank.num_frames_ready)
    assert fbank.num_frames_ready == FbankConfig().num_frames(200 * 1600)
    assert most_retained <= 11


def test_lifecycle_errors():
    fbank = StreamingFbank()
    fbank.input_finished()
    assert fbank.is_finished
    with pytest.raises(RuntimeError, match="after input_finished"):
        fbank.accept_waveform(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError, match="called twice"):
        fbank.input_finished()


@pytest.mark.parametrize("bad", [np.zeros(10), np.zeros((10, 1), np.float32), [0.0] * 10])
def test_rejects_non_mono_float32(bad):
    with pytest.raises(ValueError, match="1-D float32"):
        StreamingFbank().accept_waveform(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_mel_bins": 0}, "num_mel_bins must be >= 1, got 0"),
        ({"frame_shift_ms": 30.0}, "frame_shift_ms <= frame_length_ms"),
        ({"dither": -1.0}, "must be >= 0"),
        ({"window_type": "kaiser"}, "unknown window_type 'kaiser'"),
        ({"input_scale": 0.0}, "input_scale must be > 0"),
        ({"sample_rate": 0}, "sample_rate must be > 0"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FbankConfig(**kwargs)


def test_config_maps_onto_knf_options():
    opts = FbankConfig().to_knf_options()
    assert opts.mel_opts.num_bins == 80
    assert opts.frame_opts.dither == 0.0
    assert opts.frame_opts.window_type == "povey"
    assert opts.frame_opts.snip_edges and not opts.use_energy
    assert opts.energy_floor == 0.0
    assert FbankConfig(num_mel_bins=40).to_knf_options().mel_opts.num_bins == 40
    assert StreamingFbank(FbankConfig(num_mel_bins=40)).dim == 40
