import math

import numpy as np
import pytest

from oasr.audio import (
    F32_MAX_ABS,
    PCM_FORMATS,
    bytes_per_sample,
    decode_pcm,
    validate_sample_rate,
)


def test_formats_and_sample_sizes():
    assert PCM_FORMATS == ("s16le", "f32le")
    assert bytes_per_sample("s16le") == 2
    assert bytes_per_sample("f32le") == 4


def test_s16le_scales_int16_to_unit_range():
    ints = np.array([0, 1, -1, 16384, 32767, -32768], dtype="<i2")
    out = decode_pcm(ints.tobytes(), "s16le")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, ints.astype(np.float32) / 32768.0)
    assert out[-1] == -1.0 and out[-2] < 1.0
    # The fbank's int16-range scaling recovers the exact integers.
    np.testing.assert_array_equal(out * 32768.0, ints.astype(np.float32))


def test_s16le_is_little_endian_regardless_of_host():
    assert decode_pcm(b"\x01\x00", "s16le")[0] == np.float32(1 / 32768)
    assert decode_pcm(b"\x00\x01", "s16le")[0] == np.float32(256 / 32768)


def test_f32le_roundtrip_and_little_endian():
    x = np.array([0.0, 0.5, -0.25, 1.0, -1.0], dtype="<f4")
    np.testing.assert_array_equal(decode_pcm(x.tobytes(), "f32le"), x)
    assert decode_pcm(b"\x00\x00\x80\x3f", "f32le")[0] == 1.0  # 1.0f, little-endian bytes


def test_output_is_owned_writable_copy():
    data = bytearray(np.array([0.1, 0.2], dtype="<f4").tobytes())
    out = decode_pcm(data, "f32le")
    out[0] = 0.9
    data[:4] = np.array([0.3], dtype="<f4").tobytes()
    assert out[0] == np.float32(0.9)
    s16 = decode_pcm(memoryview(b"\x01\x00\x02\x00"), "s16le")
    s16[0] = 0.5  # writable


@pytest.mark.parametrize("fmt", ["s16le", "f32le"])
def test_empty_frame_decodes_to_empty(fmt):
    out = decode_pcm(b"", fmt)
    assert out.shape == (0,) and out.dtype == np.float32


@pytest.mark.parametrize(("fmt", "nbytes"), [("s16le", 3), ("f32le", 6), ("f32le", 1)])
def test_partial_sample_is_rejected(fmt, nbytes):
    with pytest.raises(ValueError, match=f"{nbytes} bytes is not a whole number"):
        decode_pcm(b"\x00" * nbytes, fmt)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_rejected(bad):
    x = np.array([0.0, 0.1, bad, 0.2], dtype="<f4")
    with pytest.raises(ValueError, match="1 non-finite samples \\(first at index 2"):
        decode_pcm(x.tobytes(), "f32le")


def test_slight_overshoot_is_clipped():
    x = np.array([1.5, -F32_MAX_ABS, 0.5], dtype="<f4")
    np.testing.assert_array_equal(decode_pcm(x.tobytes(), "f32le"), [1.0, -1.0, 0.5])


@pytest.mark.parametrize("peak", [2.01, 100.0, 32767.0])
def test_far_out_of_range_floats_are_rejected(peak):
    x = np.array([0.0, -peak], dtype="<f4")
    with pytest.raises(ValueError, match="exceeds 2"):
        decode_pcm(x.tobytes(), "f32le")


@pytest.mark.parametrize("fmt", ["s24le", "S16LE", "", None, "pcm"])
def test_unknown_format_is_rejected(fmt):
    with pytest.raises(ValueError, match="unknown PCM format"):
        decode_pcm(b"\x00\x00\x00\x00", fmt)
    with pytest.raises(ValueError, match="unknown PCM format"):
        bytes_per_sample(fmt)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000, 96000, 192000])
def test_sample_rate_range_accepted(rate):
    assert validate_sample_rate(rate) == rate


def test_integral_float_sample_rate_accepted_as_int():
    rate = validate_sample_rate(48000.0)
    assert rate == 48000 and type(rate) is int


@pytest.mark.parametrize("rate", [0, -16000, 7999, 192001, 10**9])
def test_out_of_range_sample_rate_rejected(rate):
    with pytest.raises(ValueError, match=f"{rate} Hz is outside the supported range 8000..192000"):
        validate_sample_rate(rate)


@pytest.mark.parametrize("rate", [44100.5, math.nan, math.inf])
def test_non_integral_sample_rate_rejected(rate):
    with pytest.raises(ValueError, match="whole number of Hz"):
        validate_sample_rate(rate)


@pytest.mark.parametrize("rate", ["16000", None, True, [16000]])
def test_non_numeric_sample_rate_rejected(rate):
    with pytest.raises(ValueError, match="must be a number of Hz"):
        validate_sample_rate(rate)
