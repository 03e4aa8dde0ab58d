import numpy as np
import pytest
import soundfile as sf
import soxr

from oasr.audio import StreamingResampler


def _stream(resampler, samples, rng, max_piece=4000):
    pieces, i = [], 0
    while i < samples.shape[0]:
        n = int(rng.integers(0, max_piece))  # 0-sized pieces included
        pieces.append(resampler.process(samples[i : i + n]))
        i += n
    pieces.append(resampler.flush())
    return np.concatenate(pieces)


def test_48k_streamed_in_random_pieces_equals_one_shot(hello_48k):
    audio, rate = sf.read(hello_48k, dtype="float32")
    assert rate == 48000
    rng = np.random.default_rng(0)
    resampler = StreamingResampler(48000)
    streamed = _stream(resampler, audio, rng)
    one_shot = soxr.resample(audio, 48000, 16000, quality="HQ")
    assert streamed.dtype == np.float32
    assert streamed.shape == one_shot.shape == (round(audio.shape[0] / 3),)
    np.testing.assert_allclose(streamed, one_shot, atol=1e-5)
    assert resampler.num_input_samples == audio.shape[0]
    assert resampler.num_output_samples == streamed.shape[0]


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 96000])
@pytest.mark.parametrize("num_samples", [1, 399, 44101])
def test_total_length_is_ratio_rounded_half_up(rate, num_samples):
    rng = np.random.default_rng(rate + num_samples)
    audio = (0.1 * rng.standard_normal(num_samples)).astype(np.float32)
    streamed = _stream(StreamingResampler(rate), audio, rng, max_piece=700)
    assert streamed.shape[0] == (2 * num_samples * 16000 + rate) // (2 * rate)
    one_shot = soxr.resample(audio, rate, 16000)
    np.testing.assert_allclose(streamed, one_shot, atol=1e-5)


def test_resampled_tone_keeps_its_frequency():
    t = np.arange(44100) / 44100
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    resampler = StreamingResampler(44100)
    out = np.concatenate([resampler.process(tone), resampler.flush()])
    spectrum = np.abs(np.fft.rfft(out))
    assert out.shape == (16000,)
    assert np.argmax(spectrum) == 1000  # 1 Hz bins over one second


def test_output_lags_until_flush():
    resampler = StreamingResampler(48000)
    first = resampler.process(np.zeros(480, dtype=np.float32))
    assert first.shape[0] < 160
    assert resampler.flush().shape[0] > 0


def test_passthrough_returns_input_itself_without_delay():
    resampler = StreamingResampler(16000)
    x = np.arange(10, dtype=np.float32)
    assert resampler.is_passthrough
    assert resampler.process(x) is x
    flushed = resampler.flush()
    assert flushed.shape == (0,) and flushed.dtype == np.float32
    assert resampler.num_input_samples == resampler.num_output_samples == 10


def test_resampling_is_not_passthrough():
    assert not StreamingResampler(48000).is_passthrough


@pytest.mark.parametrize("in_rate", [16000, 48000])
def test_process_after_flush_raises(in_rate):
    resampler = StreamingResampler(in_rate)
    resampler.flush()
    with pytest.raises(RuntimeError, match="already flushed"):
        resampler.process(np.zeros(4, dtype=np.float32))
    with pytest.raises(RuntimeError, match="already flushed"):
        resampler.flush()


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(4, dtype=np.float64),
        np.zeros((4, 2), dtype=np.float32),
        [0.0, 0.1],
        np.zeros(3, np.int16),
    ],
)
def test_rejects_non_mono_float32(bad):
    resampler = StreamingResampler(48000)
    with pytest.raises(ValueError, match="1-D float32"):
        resampler.process(bad)
    assert resampler.num_input_samples == 0


def test_rejects_bad_rates_and_quality():
    with pytest.raises(ValueError, match="outside the supported range"):
        StreamingResampler(4000)
    with pytest.raises(ValueError, match="outside the supported range"):
        StreamingResampler(48000, out_rate=500000)
    with pytest.raises(ValueError, match="unknown resample quality 'best'"):
        StreamingResampler(48000, quality="best")


def test_non_contiguous_input_is_accepted():
    x = (0.1 * np.random.default_rng(3).standard_normal(9600)).astype(np.float32)
    a, b = StreamingResampler(48000), StreamingResampler(48000)
    strided = np.repeat(x, 2)[::2]
    assert not strided.flags["C_CONTIGUOUS"]
    out_a = np.concatenate([a.process(strided), a.flush()])
    out_b = np.concatenate([b.process(x), b.flush()])
    np.testing.assert_array_equal(out_a, out_b)
