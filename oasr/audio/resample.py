"""Streaming resampling of client audio to the model's 16 kHz."""

from __future__ import annotations

import numpy as np
import soxr

from oasr.audio.pcm import validate_sample_rate

MODEL_SAMPLE_RATE = 16000
"""Sample rate in Hz of everything after the resampler (fbank, model)."""

RESAMPLE_QUALITIES: tuple[str, ...] = ("QQ", "LQ", "MQ", "HQ", "VHQ")
"""soxr quality recipes, quickest to best."""


class StreamingResampler:
    """Converts one stream's mono float32 audio from ``in_rate`` to ``out_rate`` piece by piece.

    Invariant: the concatenation of every `process` output and the `flush` output equals soxr's
    resampling of the whole concatenated input, and its length is N * out / in rounded half
    up for N input samples. soxr's streaming resampler holds a bounded filter history (its ``delay``), so
    a stream of any length costs constant memory; output lags input by that delay until
    `flush`.

    When ``in_rate == out_rate`` the resampler is a passthrough: `process` returns its input
    object itself (no copy, no delay) and `flush` returns an empty array.
    """

    def __init__(
        self, in_rate: int, out_rate: int = MODEL_SAMPLE_RATE, quality: str = "HQ"
    ) -> None:
        """Args:
            in_rate: input sample rate in Hz (8000..192000, see `validate_sample_rate`).
            out_rate: output sample rate in Hz (same range).
            quality: a soxr recipe from `RESAMPLE_QUALITIES`.

        Raises:
            ValueError: a rate out of range or an unknown quality.
        """
        if quality not in RESAMPLE_QUALITIES:
            raise ValueError(
                f"unknown resample quality {quality!r}; expected one of "
                f"{', '.join(RESAMPLE_QUALITIES)}"
            )
        self.in_rate = validate_sample_rate(in_rate)
        self.out_rate = validate_sample_rate(out_rate)
        self.quality = quality
        self._stream: soxr.ResampleStream | None = None
        if self.in_rate != self.out_rate:
            self._stream = soxr.ResampleStream(
                self.in_rate, self.out_rate, 1, dtype="float32", quality=quality
            )
        self.num_input_samples = 0
        self.num_output_samples = 0
        self.is_flushed = False

    @property
    def is_passthrough(self) -> bool:
        """True when input and output rates are equal (no resampling at all)."""
        return self._stream is None

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Resample the next piece of the stream.

        Args:
            samples: (N,) float32 mono samples at ``in_rate``; N may be 0.

        Returns:
            (M,) float32 samples at ``out_rate``; M may be 0 while soxr fills its filter.
            In passthrough mode, ``samples`` itself.

        Raises:
            ValueError: ``samples`` is not a 1-D float32 array.
            RuntimeError: called after `flush`.
        """
        self._check_open("process")
        _check_mono_f32(samples)
        self.num_input_samples += samples.shape[0]
        if self._stream is None:
            out = samples
        else:
            out = self._stream.resample_chunk(np.ascontiguousarray(samples))
        self.num_output_samples += out.shape[0]
        return out

    def flush(self) -> np.ndarray:
        """End the stream and return the samples still held in soxr's filter.

        Returns:
            (M,) float32 samples at ``out_rate`` (empty in passthrough mode).

        Raises:
            RuntimeError: called twice.
        """
        self._check_open("flush")
        self.is_flushed = True
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        out = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self.num_output_samples += out.shape[0]
        return out

    def _check_open(self, action: str) -> None:
        if self.is_flushed:
            raise RuntimeError(
                f"cannot {action}: resampler {self.in_rate}->{self.out_rate} Hz was already "
                f"flushed after {self.num_input_samples} input samples"
            )


def _check_mono_f32(samples: np.ndarray) -> None:
    if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
        desc = (
            f"{samples.dtype} array of shape {samples.shape}"
            if isinstance(samples, np.ndarray)
            else type(samples).__name__
        )
        raise ValueError(f"expected a 1-D float32 array of mono samples, got {desc}")
