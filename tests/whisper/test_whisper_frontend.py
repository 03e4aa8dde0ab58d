"""Whisper log-mel frontend, tokenizer and transcript normaliser."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oasr.models.whisper import WhisperCheckpoint, WhisperFrontend, mel_filterbank
from oasr.models.whisper.frontend import N_FRAMES, N_SAMPLES, _hz_to_mel, _mel_to_hz


def test_slaney_mel_scale_facts() -> None:
    hz = np.array([0.0, 200.0, 1000.0, 6400.0, 8000.0])
    mel = _hz_to_mel(hz)
    np.testing.assert_allclose(mel[:3], [0.0, 3.0, 15.0])
    np.testing.assert_allclose(mel[3], 15.0 + 27.0)  # 6.4x above 1 kHz is 27 log-steps
    np.testing.assert_allclose(_mel_to_hz(mel), hz, rtol=1e-12)


def test_filterbank_is_slaney_normalised_triangles() -> None:
    filters = mel_filterbank(80).double()  # (80, 201)
    assert filters.shape == (80, 201) and torch.all(filters >= 0)
    peaks = filters.argmax(dim=1)
    assert torch.all(peaks[1:] >= peaks[:-1])
    area = filters.sum(dim=1) * 40.0  # 40 Hz per bin: each triangle's area is 1
    torch.testing.assert_close(area[50:], torch.ones(30, dtype=torch.float64), rtol=0.03, atol=0)
    assert filters[:, 0].sum() == 0  # DC is below the first band's centre


def test_log_mel_of_a_tone_and_padding() -> None:
    t = torch.arange(16000) / 16000.0
    tone = 0.5 * torch.sin(2 * math.pi * 440.0 * t)
    mel = WhisperFrontend()([tone, tone[:8000]])
    assert mel.shape == (2, 80, N_FRAMES)
    band_hz = _mel_to_hz(np.linspace(0, _hz_to_mel(np.array(8000.0)), 82))[1:-1]
    loudest = int(mel[0, :, 50].argmax())
    assert abs(band_hz[loudest] - 440.0) < 60.0
    peak = mel[0].max()
    assert torch.all(mel[0] >= peak - 2.0 - 1e-6)  # floored 8 log10 units (/4) below the peak
    torch.testing.assert_close(mel[0, :, 200:], torch.full_like(mel[0, :, 200:], float(peak) - 2))
    alone = WhisperFrontend()([tone[:8000]])
    torch.testing.assert_close(alone[0], mel[1])


def test_frontend_refuses_bad_input() -> None:
    frontend = WhisperFrontend()
    with pytest.raises(ValueError, match="480001 samples"):
        frontend([torch.zeros(N_SAMPLES + 1)])
    with pytest.raises(ValueError, match="must be 1-D"):
        frontend([torch.zeros(2, 100)])
    with pytest.raises(ValueError, match="at least one waveform"):
        frontend([])


def test_real_tokenizer_round_trip(checkpoint: WhisperCheckpoint) -> None:
    tokenizer = checkpoint.tokenizer
    ids = tokenizer.encode(" And so my fellow Americans")
    assert ids == [843, 523, 616, 5891, 3399]
    assert tokenizer.decode([50257, 50362, *ids, 50256]) == "And so my fellow Americans"
    assert tokenizer.eot == 50256 and checkpoint.spec.prompt == (50257, 50362)
