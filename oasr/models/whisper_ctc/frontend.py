"""The causal log-mel frontend of the Whisper-CTC model (training and serving share it).

Definition (16 kHz audio): frame i is the 400-point periodic-Hann power spectrum of samples
[160 i - 200, 160 i + 200) of the stream (zeros before sample 0), so frame i is complete once
160 i + 200 samples have arrived; Whisper's Slaney mel filterbank; ``log10(max(mel, 1e-10))``;
floored at (the running maximum of this stream's log-mel values so far, this frame included)
minus 8; then ``(x + 4) / 4``. Unlike Whisper's own frontend, no frame depends on later audio:
the floor uses a running maximum instead of the utterance's maximum.

The spectra are computed in float32 with torch, many streams' frames in one call
(`CausalLogMel.accept_many`: the engine's step hands every stream's new audio over at once, so one FFT and
one mel product cover them all, and the floors of every stream are applied in a few array
operations); each stream keeps only its samples and its running maximum.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from oasr.models.whisper.frontend import mel_filterbank

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
HALF = N_FFT // 2
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0


class LogMelSpectra:
    """The constants every frame of one mel size shares: window and filterbank (float32).
    One is shared by all the streams of an engine (`WhisperCtcFamily.new_features`)."""

    def __init__(self, n_mels: int) -> None:
        self.n_mels = n_mels
        self.window = torch.hann_window(N_FFT, periodic=True, dtype=torch.float32)  # (400,)
        filters = mel_filterbank(n_mels).T  # (201, M) float32
        # each bin's weight twice, for its real and imaginary part squared: the power
        # spectrum's sum happens inside the product
        self.filters = filters.repeat_interleave(2, dim=0).contiguous()  # (402, M)
        self._frames = threading.local()  # per thread: its reused (rows, 400) frames buffer

    def log_mel(self, windows: Sequence[torch.Tensor]) -> torch.Tensor:
        """(F_i, 400) float32 windows of samples, any number of pieces -> (sum F_i, n_mels)
        float32 log10 mel, before the floor: one FFT and one product for every row, however
        many streams they came from."""
        total = sum(len(w) for w in windows)
        if not total:
            return torch.zeros((0, self.n_mels))  # (MKL's FFT refuses an empty batch)
        # a copy (the pieces may view a stream's buffer) into a buffer kept between calls: at
        # hundreds of streams the frames are tens of MiB, which a fresh tensor would have
        # faulted in page by page on every step (`oasr.engine.runner.host_memory`)
        frames = torch.cat(list(windows), out=self._frames_buffer(total))
        spectrum = torch.fft.rfft(frames.mul_(self.window), n=N_FFT)  # (F, 201) complex
        squares = torch.view_as_real(spectrum).square_().view(len(frames), -1)  # (F, 402)
        return (squares @ self.filters).clamp_min_(LOG_FLOOR).log10_()

    def _frames_buffer(self, rows: int) -> torch.Tensor:
        """This thread's frames buffer, ``rows`` rows long (grown to 1.25x when short)."""
        buffer: torch.Tensor | None = getattr(self._frames, "buffer", None)
        if buffer is None or len(buffer) < rows:
            with torch.inference_mode(False):  # a normal tensor, written in place whatever mode
                buffer = torch.empty((rows + rows // 4, N_FFT), dtype=torch.float32)
            self._frames.buffer = buffer
        return buffer[:rows]


def _apply_floors(log_mel: np.ndarray, counts: Sequence[int], running_max: Sequence[float]
                  ) -> tuple[np.ndarray, list[float]]:
    """Floor each stream's frames at (its running maximum, that frame included) - 8 and
    rescale, many streams at once.

    Args:
        log_mel: (sum counts, n_mels) float32, stream i's ``counts[i] >= 1`` rows in order;
            the features are written over it.
        running_max: each stream's running maximum before these frames.
    Returns:
        ((sum counts, n_mels) float32 features, each stream's new running maximum).

    The running maximum restarts at every stream's first row: the rows of the streams with
    one count are a (streams, count) array whose cumulative maximum runs along its rows (a
    step's streams mostly share one count).
    """
    counts_arr = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts_arr) - counts_arr  # (S,) each stream's first row
    frame_max = log_mel.max(axis=1)  # (F,) float32
    peaks = np.empty_like(frame_max)
    before = np.asarray(running_max, dtype=np.float32)  # (exact: each is a float32's value)
    for count in np.unique(counts_arr).tolist():
        members = np.flatnonzero(counts_arr == count)  # streams with ``count`` rows
        rows = starts[members, None] + np.arange(count)  # (S_c, count) their rows
        running = np.maximum.accumulate(frame_max[rows], axis=1)
        peaks[rows] = np.maximum(running, before[members, None])
    # in place: at hundreds of streams each new array of the step's frames is tens of MiB
    # faulted in page by page (x / 4 and x * 0.25 are the same float)
    features = np.maximum(log_mel, (peaks - DYNAMIC_RANGE)[:, None], out=log_mel)
    features += 4.0
    features *= 0.25
    return features, peaks[starts + counts_arr - 1].tolist()


class CausalLogMel:
    """One stream's incremental log-mel extractor.

    Invariant: ``_buffer`` (float32) holds the stream's samples from stream sample
    ``_buffer_start`` on (``-200`` at first: the zeros before sample 0), enough to window
    every frame from ``_next_frame`` on; ``_running_max`` is the maximum log-mel value of
    frames 0.._next_frame-1. Pieces of any size give the same frames as one call (up to float32
    rounding, which can differ in the last bit with how many frames share a product).
    """

    def __init__(self, n_mels: int = 80, spectra: LogMelSpectra | None = None) -> None:
        if spectra is not None and spectra.n_mels != n_mels:
            raise ValueError(f"spectra of {spectra.n_mels} mels for a {n_mels}-mel extractor")
        self.n_mels = n_mels
        self._spectra = spectra if spectra is not None else LogMelSpectra(n_mels)
        self.reset()

    def reset(self) -> None:
        """Start a new stream: no samples, no frames, no running maximum."""
        self._buffer = np.zeros(HALF, dtype=np.float32)
        self._buffer_start = -HALF  # stream index of _buffer[0]
        self._num_samples = 0
        self._next_frame = 0
        self._running_max = -np.inf

    @property
    def num_frames(self) -> int:
        """Frames emitted since the last reset."""
        return self._next_frame

    def accept(self, samples: np.ndarray) -> np.ndarray:
        """Append samples (N,) float32 in [-1, 1]; returns the (F, n_mels) frames they complete."""
        return self.accept_many([self], [samples])[0]

    @classmethod
    def accept_many(cls, extractors: Sequence[CausalLogMel],
                    samples: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``extractors[i].accept(samples[i])`` for every i, with one FFT and one mel product
        over all their new frames. Returns each extractor's (F_i, n_mels) float32 frames (views
        of one array: a caller that keeps many streams' frames copies them)."""
        windows = [e._take_windows(e._append(s)) for e, s in zip(extractors, samples, strict=True)]
        counts = [len(w) for w in windows]
        groups: dict[int, list[int]] = {}  # extractors sharing one spectra: one product
        for i, extractor in enumerate(extractors):
            groups.setdefault(id(extractor._spectra), []).append(i)
        out: list[np.ndarray] = [np.zeros((0, e.n_mels), np.float32) for e in extractors]
        for members in groups.values():
            fed = [i for i in members if counts[i]]
            if not fed:
                continue
            log_mel = extractors[fed[0]]._spectra.log_mel([windows[i] for i in fed]).numpy()
            features, maxima = _apply_floors(log_mel, [counts[i] for i in fed],
                                             [extractors[i]._running_max for i in fed])
            offset = 0
            for i, new_max in zip(fed, maxima, strict=True):
                # a view of the step's array: `BufferedFeatures` copies the frames it retains
                # into its own buffer, so none keeps the whole step's array alive
                out[i] = features[offset:offset + counts[i]]
                extractors[i]._running_max = new_max
                offset += counts[i]
        return out

    def flush(self) -> np.ndarray:
        """Complete the stream: frames whose window reaches past the end (zeros after it).

        The stream of N samples has N // 160 + 1 frames in all (frame i centred on 160 i).
        """
        total = self._num_samples // HOP + 1 if self._num_samples else 0
        windows = self._take_windows(total, pad=True)
        return self._floored(self._spectra.log_mel([windows]).numpy())

    def _append(self, samples: np.ndarray) -> int:
        """Buffer ``samples``; the number of frames they make complete."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._buffer = np.concatenate([self._buffer, samples])
        self._num_samples += len(samples)
        return max(0, (self._num_samples - HALF) // HOP + 1)  # frames i with 160 i + 200 <= n

    def _take_windows(self, until: int, pad: bool = False) -> torch.Tensor:
        """(until - _next_frame, 400) float32 windows of the next frames, and drop the samples
        no later frame needs; ``pad``: zeros after the stream's end (its last frames)."""
        count = until - self._next_frame
        if count <= 0:
            return torch.zeros((0, N_FFT))
        first = HOP * self._next_frame - HALF - self._buffer_start  # buffer index of window 0
        needed = first + HOP * (count - 1) + N_FFT
        buffer = self._buffer
        if pad and needed > len(buffer):
            buffer = np.concatenate([buffer, np.zeros(needed - len(buffer), np.float32)])
        # a strided view (count, 400) of the buffer; `LogMelSpectra.log_mel` copies it
        windows = torch.from_numpy(buffer[first:needed]).unfold(0, N_FFT, HOP)
        self._next_frame = until
        keep_from = HOP * self._next_frame - HALF  # first sample the next frame needs
        if keep_from > self._buffer_start:
            self._buffer = self._buffer[keep_from - self._buffer_start:]
            self._buffer_start = keep_from
        return windows

    def _floored(self, log_mel: np.ndarray) -> np.ndarray:
        if not len(log_mel):
            return log_mel.astype(np.float32, copy=False)
        feats, (self._running_max,) = _apply_floors(log_mel, [len(log_mel)],
                                                    [self._running_max])
        return feats


def causal_log_mel(samples: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """The whole utterance at once: (N,) float32 samples -> (N // 160 + 1, n_mels) float32,
    equal to feeding ``CausalLogMel`` in any pieces then ``flush()``."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if len(samples) == 0:
        return np.zeros((0, n_mels), dtype=np.float32)
    stream = CausalLogMel(n_mels)
    stream._append(samples)
    return stream.flush()
