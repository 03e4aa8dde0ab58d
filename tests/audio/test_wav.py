import numpy as np
import pytest
import soundfile as sf

from oasr.audio import read_audio


def test_16k_wav_is_read_exactly(devset_wavs):
    path = devset_wavs[0]
    ints, rate = sf.read(path, dtype="int16")
    assert rate == 16000
    audio = read_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    np.testing.assert_array_equal(audio, ints.astype(np.float32) / 32768.0)


def test_48k_wav_is_resampled_to_16k(hello_48k, hello_16k):
    audio = read_audio(hello_48k)
    frames_48k = sf.info(hello_48k).frames
    assert audio.dtype == np.float32
    assert audio.shape == (round(frames_48k / 3),)
    # The 16 kHz copy in tests/data was resampled from the same 48 kHz file with sox.
    reference = read_audio(hello_16k)
    assert reference.shape == audio.shape
    assert np.abs(audio - reference).max() < 1e-3


def test_stereo_is_averaged(tmp_path):
    left = np.full(1600, 0.5, dtype=np.float32)
    right = np.full(1600, -0.25, dtype=np.float32)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), 16000, subtype="FLOAT")
    audio = read_audio(path)
    np.testing.assert_allclose(audio, 0.125, atol=1e-7)


def test_other_rate_and_format_and_target_rate(tmp_path):
    t = np.arange(22050) / 22050
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    path = tmp_path / "tone.flac"
    sf.write(path, tone, 22050)
    audio = read_audio(path)
    assert audio.shape == (16000,)
    assert np.argmax(np.abs(np.fft.rfft(audio))) == 440
    assert read_audio(path, sample_rate=8000).shape == (8000,)


def test_empty_file_gives_empty_array(tmp_path):
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros(0, dtype=np.float32), 48000)
    audio = read_audio(path)
    assert audio.shape == (0,) and audio.dtype == np.float32


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="audio file not found: .*nope.wav"):
        read_audio(tmp_path / "nope.wav")


def test_directory(tmp_path):
    with pytest.raises(ValueError, match="it is a directory"):
        read_audio(tmp_path)


@pytest.mark.parametrize(
    "content", [b"", b"not audio at all" * 10, b"RIFF\x00\x00\x00\x00WAVEfmt "]
)
def test_undecodable_file(tmp_path, content):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="cannot read audio from .*bad.wav"):
        read_audio(path)


def test_absurd_file_rate(tmp_path):
    path = tmp_path / "slow.wav"
    sf.write(path, np.zeros(100, dtype=np.float32), 4000)
    with pytest.raises(ValueError, match="4000 Hz is outside the supported range"):
        read_audio(path)


def test_absurd_target_rate(devset_wavs):
    with pytest.raises(ValueError, match="outside the supported range"):
        read_audio(devset_wavs[0], sample_rate=1000)
