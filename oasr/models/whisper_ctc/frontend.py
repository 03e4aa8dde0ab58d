"""The causal log-mel frontend of the Whisper-CTC model (training and serving share it).

Definition (16 kHz audio): frame i is the 400-point periodic-Hann power spectrum of samples
[160 i - 200, 160 i + 200) of the stream (zeros before sample 0), so frame i is complete once
160 i + 200 samples have arrived; Whisper's Slaney mel filterbank; ``log10(max(mel, 1e-10))``;
floored at (the running maximum of this stream's log-mel values so far, this frame included)
minus 8; then ``(x + 4) / 4``. Unlike Whisper's own frontend, no frame depends on later audio:
the floor uses a running maximum instead of the utterance's maximum.
"""

from __future__ import annotations

import numpy as np

from oasr.models.whisper.frontend import mel_filterbank

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
HALF = N_FFT // 2
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0


def _hann(n: int) -> np.ndarray:
    """Periodic Hann window of length n (float64)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


class _Spectra:
    """Constants shared by every frame: window and filterbank."""

    def __init__(self, n_mels: int) -> None:
        self.window = _hann(N_FFT)  # (400,)
        filters = mel_filterbank(n_mels).numpy().astype(np.float64)  # (M, 201)
        # Each triangular filter covers a few adjacent bins (391 of 80 x 201 weights are
        # nonzero), so the filterbank is applied sparsely: gather the nonzero bins of every
        # band (row-major, so each band's run is contiguous), weight them, sum each run.
        bands, self.bins = np.nonzero(filters)  # (N,), (N,) sorted by band
        if len(np.unique(bands)) != n_mels:
            raise ValueError(f"every mel band needs a nonzero weight; {n_mels - len(np.unique(bands))} "
                             f"of {n_mels} are empty")
        self.weights = filters[bands, self.bins]  # (N,)
        self.band_starts = np.searchsorted(bands, np.arange(n_mels))  # (M,)

    def log_mel(self, frames: np.ndarray) -> np.ndarray:
        """(F, 400) windows of samples -> (F, n_mels) float64 log10 mel, before the floor."""
        spec = np.fft.rfft(frames * self.window, n=N_FFT, axis=-1)  # (F, 201)
        power = spec.real ** 2 + spec.imag ** 2
        # the sparse product stays in numpy's own loops, off its BLAS pool (which wakes every
        # thread of the machine for a small product: 24 ms vs 0.8 ms per chunk on 2 cores), and
        # is 3x faster than a dense einsum (82 vs 263 us per 64-frame chunk)
        mel = np.add.reduceat(power[:, self.bins] * self.weights, self.band_starts, axis=1)
        return np.log10(np.maximum(mel, LOG_FLOOR))


def _frame_windows(samples: np.ndarray, first: int, count: int, start: int) -> np.ndarray:
    """Windows of frames first..first+count-1 from ``samples`` that begin at stream sample
    ``start`` (zeros where a window reaches outside them). Returns (count, 400) float64."""
    lo = HOP * (first + np.arange(count)) - HALF - start  # (count,) first sample of each window
    left = max(0, -int(lo[0]))
    right = max(0, int(lo[-1]) + N_FFT - len(samples))
    padded = np.pad(samples, (left, right)) if left or right else samples
    return padded[(lo + left)[:, None] + np.arange(N_FFT)[None, :]]


def _apply_floor(log_mel: np.ndarray, running_max: float) -> tuple[np.ndarray, float]:
    """Floor each frame at (running max incl. that frame) - 8 and rescale.

    Returns ((F, n_mels) float32 features, the new running maximum).
    """
    frame_max = np.maximum.accumulate(log_mel.max(axis=1)) if len(log_mel) else log_mel[:, 0]
    peaks = np.maximum(frame_max, running_max)  # (F,)
    floored = np.maximum(log_mel, peaks[:, None] - DYNAMIC_RANGE)
    new_max = float(peaks[-1]) if len(peaks) else running_max
    return ((floored + 4.0) / 4.0).astype(np.float32), new_max


class CausalLogMel:
    """One stream's incremental log-mel extractor.

    Invariant: ``_buffer`` holds the stream's samples from ``_buffer_start`` on, enough to
    compute every frame from ``_next_frame`` on; ``_running_max`` is the maximum log-mel value of
    frames 0.._next_frame-1. Pieces of any size give the same frames as one call.
    """

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self._spectra = _Spectra(n_mels)
        self.reset()

    def reset(self) -> None:
        """Start a new stream: no samples, no frames, no running maximum."""
        self._buffer = np.zeros(0, dtype=np.float64)
        self._buffer_start = 0  # stream index of _buffer[0]
        self._num_samples = 0
        self._next_frame = 0
        self._running_max = -np.inf

    @property
    def num_frames(self) -> int:
        """Frames emitted since the last reset."""
        return self._next_frame

    def accept(self, samples: np.ndarray) -> np.ndarray:
        """Append samples (N,) float32 in [-1, 1]; returns the (F, n_mels) frames they complete."""
        samples = np.asarray(samples, dtype=np.float64).reshape(-1)
        self._buffer = np.concatenate([self._buffer, samples])
        self._num_samples += len(samples)
        ready = max(0, (self._num_samples - HALF) // HOP + 1)  # frames i with 160 i + 200 <= n
        return self._emit(ready)

    def flush(self) -> np.ndarray:
        """Complete the stream: frames whose window reaches past the end (zeros after it).

        The stream of N samples has N // 160 + 1 frames in all (frame i centred on 160 i).
        """
        total = self._num_samples // HOP + 1 if self._num_samples else 0
        return self._emit(total)

    def _emit(self, until: int) -> np.ndarray:
        count = until - self._next_frame
        if count <= 0:
            return np.zeros((0, self.n_mels), dtype=np.float32)
        windows = _frame_windows(self._buffer, self._next_frame, count, self._buffer_start)
        feats, self._running_max = _apply_floor(self._spectra.log_mel(windows), self._running_max)
        self._next_frame = until
        keep_from = max(HOP * until - HALF, 0)  # first sample the next frame needs
        drop = keep_from - self._buffer_start
        if drop > 0:
            self._buffer = self._buffer[drop:]
            self._buffer_start = keep_from
        return feats


def causal_log_mel(samples: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """The whole utterance at once: (N,) float32 samples -> (N // 160 + 1, n_mels) float32,
    equal to feeding ``CausalLogMel`` in any pieces then ``flush()``."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    if len(samples) == 0:
        return np.zeros((0, n_mels), dtype=np.float32)
    spectra = _Spectra(n_mels)
    num_frames = len(samples) // HOP + 1
    padded = np.concatenate([np.zeros(HALF), samples, np.zeros(N_FFT)])
    idx = HOP * np.arange(num_frames)[:, None] + np.arange(N_FFT)[None, :]  # (F, 400)
    log_mel = spectra.log_mel(padded[idx])
    feats, _ = _apply_floor(log_mel, -np.inf)
    return feats
