import numpy as np
import pytest
import soundfile as sf

from oasr.audio import (
    AudioFrontend,
    ChunkGeometry,
    FrontendConfig,
    compute_fbank,
    read_audio,
    split_windows,
)


def _feed_bytes(frontend, data: bytes, rng, sample_bytes: int):
    windows, i = [], 0
    while i < len(data):
        n = int(rng.integers(0, 2000)) * sample_bytes
        frontend.accept_pcm(data[i : i + n])
        i += n
        while (w := frontend.pop_window()) is not None:
            windows.append(w)
    frontend.input_finished()
    while (w := frontend.pop_window()) is not None:
        windows.append(w)
    return windows


def test_16k_s16le_stream_equals_offline_windows(hello_16k):
    ints, _ = sf.read(hello_16k, dtype="int16")
    frontend = AudioFrontend(FrontendConfig(sample_rate=16000, fmt="s16le"))
    windows = _feed_bytes(frontend, ints.astype("<i2").tobytes(), np.random.default_rng(0), 2)
    offline = split_windows(compute_fbank(read_audio(hello_16k)))
    assert len(windows) == len(offline) > 3
    for got, want in zip(windows, offline, strict=True):
        np.testing.assert_array_equal(got.feats, want)
    assert windows[-1].is_last and frontend.is_exhausted()
    assert frontend.num_input_samples == frontend.num_model_samples == ints.shape[0]


def test_48k_f32le_stream_matches_offline_read(hello_48k):
    audio, _ = sf.read(hello_48k, dtype="float32")
    frontend = AudioFrontend(FrontendConfig(sample_rate=48000, fmt="f32le"))
    windows = _feed_bytes(frontend, audio.astype("<f4").tobytes(), np.random.default_rng(1), 4)
    offline = split_windows(compute_fbank(read_audio(hello_48k)))
    assert len(windows) == len(offline)
    for got, want in zip(windows, offline, strict=True):
        np.testing.assert_allclose(got.feats, want, atol=1e-3)
    assert frontend.num_input_samples == audio.shape[0]
    assert frontend.num_model_samples == round(audio.shape[0] / 3)


def test_chunk_geometry_is_configurable(hello_16k):
    ints, _ = sf.read(hello_16k, dtype="int16")
    config = FrontendConfig(geometry=ChunkGeometry(chunk_size=8))
    windows = _feed_bytes(AudioFrontend(config), ints.tobytes(), np.random.default_rng(2), 2)
    assert {w.num_frames for w in windows[:-1]} == {35}
    assert [w.start_frame for w in windows] == [32 * i for i in range(len(windows))]


def test_bad_pcm_leaves_stream_usable():
    frontend = AudioFrontend(FrontendConfig(sample_rate=16000, fmt="f32le"))
    frontend.accept_pcm(np.zeros(800, dtype="<f4").tobytes())
    with pytest.raises(ValueError, match="non-finite"):
        frontend.accept_pcm(np.array([np.nan] * 4, dtype="<f4").tobytes())
    with pytest.raises(ValueError, match="not a whole number"):
        frontend.accept_pcm(b"\x00" * 5)
    assert frontend.num_input_samples == 800
    assert frontend.accept_pcm(np.zeros(800, dtype="<f4").tobytes()) == 800
    assert frontend.num_model_samples == 1600 and frontend.fbank.num_frames_ready == 8


def test_window_readiness_follows_audio():
    frontend = AudioFrontend()
    samples_for_67_frames = 400 + 160 * 66
    frontend.accept_samples(np.zeros(samples_for_67_frames - 1, dtype=np.float32))
    assert not frontend.is_window_ready()
    frontend.accept_samples(np.zeros(1, dtype=np.float32))
    assert frontend.is_window_ready()
    assert frontend.pop_window().num_output_frames == 16


def test_lifecycle_errors():
    frontend = AudioFrontend(FrontendConfig(sample_rate=48000))
    frontend.accept_pcm(np.zeros(4800, dtype="<i2").tobytes())
    frontend.input_finished()
    assert frontend.is_finished
    with pytest.raises(RuntimeError, match="already finished after 4800 samples"):
        frontend.accept_pcm(b"\x00\x00")
    with pytest.raises(RuntimeError, match="already finished"):
        frontend.accept_samples(np.zeros(2, dtype=np.float32))
    with pytest.raises(RuntimeError, match="already finished"):
        frontend.input_finished()
    assert frontend.num_model_samples == 1600  # the resampler's tail was flushed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_rate": 1000}, "outside the supported range"),
        ({"sample_rate": 44100.5}, "whole number of Hz"),
        ({"fmt": "mp3"}, "unknown PCM format 'mp3'"),
        ({"resample_quality": "ultra"}, "unknown resample quality 'ultra'"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FrontendConfig(**kwargs)


def test_config_normalises_integral_float_rate():
    config = FrontendConfig(sample_rate=48000.0)
    assert config.sample_rate == 48000 and type(config.sample_rate) is int
