"""Reading audio files into the model's input: mono float32 at 16 kHz."""

from __future__ import annotations

import os

import numpy as np
import soundfile as sf
import soxr

from oasr.audio.pcm import validate_sample_rate
from oasr.audio.resample import MODEL_SAMPLE_RATE


def read_audio(path: str | os.PathLike[str], sample_rate: int = MODEL_SAMPLE_RATE) -> np.ndarray:
    """Read any file libsndfile decodes (wav, flac, ogg, ...) as mono float32 at ``sample_rate``.

    Channels are averaged; integer PCM is scaled to [-1, 1) (int16 by 1/32768); a file at
    another rate is resampled with soxr's high-quality one-shot resampler.

    Args:
        path: the audio file.
        sample_rate: output rate in Hz (8000..192000).

    Returns:
        (N,) float32 samples, possibly empty for an empty file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is a directory, not audio libsndfile can decode, or its sample
            rate is outside 8000..192000 Hz.
    """
    path = os.fspath(path)
    out_rate = validate_sample_rate(sample_rate)
    if not os.path.exists(path):
        raise FileNotFoundError(f"audio file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"cannot read audio from {path}: it is a directory")
    try:
        data, file_rate = sf.read(path, dtype="float32", always_2d=True)  # (N, C)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise ValueError(f"cannot read audio from {path}: {exc}") from exc
    try:
        file_rate = validate_sample_rate(file_rate)
    except ValueError as exc:
        raise ValueError(f"cannot read audio from {path}: {exc}") from exc
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)  # (N,)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if file_rate == out_rate or mono.shape[0] == 0:
        return mono
    return soxr.resample(mono, file_rate, out_rate, quality="HQ").astype(np.float32, copy=False)
