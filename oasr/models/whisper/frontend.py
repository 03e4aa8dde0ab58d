"""Whisper's log-mel frontend: 30 s windows of 16 kHz audio -> (80, 3000) normalised log-mel.

Facts of the format: a 400-point periodic Hann STFT with hop 160 (centre-padded by reflection),
power spectrum, an 80-band Slaney-normalised mel filterbank on the Slaney mel scale (0..8 kHz),
``log10(max(mel, 1e-10))``, floored at 8 below the window's maximum, then ``(x + 4) / 4``. Audio
shorter than the window (30 s unless the caller asks for fewer frames) is padded with zeros
before the STFT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
WINDOW_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS  # 480000 samples per window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window

_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = 15.0  # 1000 Hz on the Slaney scale (linear part: 3 mel per 200 Hz)
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = 3.0 * hz / 200.0
    log_part = hz >= _MIN_LOG_HZ
    safe = np.maximum(hz, _MIN_LOG_HZ)
    return np.where(log_part, _MIN_LOG_MEL + np.log(safe / _MIN_LOG_HZ) / _LOG_STEP, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    log_part = mel >= _MIN_LOG_MEL
    return np.where(log_part, _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel - _MIN_LOG_MEL)), hz)


def mel_filterbank(
    n_mels: int = 80, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE
) -> torch.Tensor:
    """Slaney-scale, Slaney-normalised triangular filters.

    Returns:
        (n_mels, n_fft // 2 + 1) float32: row i weights the power-spectrum bins of band i.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges_mel = np.linspace(0.0, float(_hz_to_mel(np.array(sample_rate / 2.0))), n_mels + 2)
    edges_hz = _mel_to_hz(edges_mel)  # (n_mels + 2,)
    widths = np.diff(edges_hz)  # (n_mels + 1,)
    ramps = edges_hz[:, None] - fft_hz[None, :]  # (n_mels + 2, bins)
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))  # (n_mels, bins)
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


class WhisperFrontend:
    """Batched log-mel of up to 30 s per row, on the filterbank's device.

    Holds only constants (window and filterbank), no per-stream state.
    """

    def __init__(self, n_mels: int = 80, device: torch.device | str = "cpu") -> None:
        self.n_mels = n_mels
        self.device = torch.device(device)
        self.window = torch.hann_window(N_FFT, device=self.device)  # periodic
        self.filters = mel_filterbank(n_mels).to(self.device)  # (n_mels, 201)

    def __call__(self, waveforms: Sequence[torch.Tensor | np.ndarray],
                 num_frames: int = N_FRAMES) -> torch.Tensor:
        """Log-mel features of each waveform, zero-padded to ``num_frames`` frames.

        The default is one 30 s window. A shorter window gives exactly the first ``num_frames``
        frames of the 30 s window: every frame's STFT reads real or zero-padded samples (the
        buffer holds half an FFT of zeros past the last frame's centre), and frames past the
        audio sit at the floor, so the window's peak is the same.

        Args:
            waveforms: B mono 16 kHz waveforms, float in [-1, 1], each at most
                ``num_frames * 160`` samples.
            num_frames: mel frames per row, 1..3000.
        Returns:
            (B, n_mels, num_frames) float32.
        Raises:
            ValueError: an empty batch, a waveform that is not 1-D, one longer than
                ``num_frames`` frames, or ``num_frames`` outside 1..3000.
        """
        if len(waveforms) == 0:
            raise ValueError("WhisperFrontend needs at least one waveform, got 0")
        if not 1 <= num_frames <= N_FRAMES:
            raise ValueError(f"num_frames must be in 1..{N_FRAMES}, got {num_frames}")
        limit = num_frames * HOP_LENGTH
        batch = torch.zeros(len(waveforms), limit + N_FFT // 2, device=self.device)
        for row, wave in enumerate(waveforms):
            samples = torch.as_tensor(wave, dtype=torch.float32).to(self.device)
            if samples.dim() != 1:
                raise ValueError(f"waveform {row} must be 1-D, got shape {tuple(samples.shape)}")
            if samples.numel() > limit:
                raise ValueError(
                    f"waveform {row} has {samples.numel()} samples "
                    f"({samples.numel() / SAMPLE_RATE:.2f} s); this window holds at most "
                    f"{limit} ({limit / SAMPLE_RATE:.2f} s, Whisper's whole window is "
                    f"{WINDOW_SECONDS} s): split the segment or widen the window"
                )
            batch[row, : samples.numel()] = samples
        return self.log_mel(batch)[:, :, :num_frames]

    def log_mel(self, audio: torch.Tensor) -> torch.Tensor:
        """(B, S) float32 samples -> (B, n_mels, S // 160) normalised log-mel (last frame dropped)."""
        stft = torch.stft(
            audio, N_FFT, HOP_LENGTH, window=self.window, center=True, return_complex=True
        )  # (B, 201, S // 160 + 1)
        power = stft[..., :-1].abs() ** 2  # (B, 201, F)
        mel = torch.matmul(self.filters, power)  # (B, n_mels, F)
        log_spec = torch.clamp(mel, min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)  # (B, 1, 1)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return (log_spec + 4.0) / 4.0
