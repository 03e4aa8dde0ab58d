"""Decoding of client PCM frames and validation of client sample rates.

A client streams raw little-endian PCM in one of two formats (the ``start`` message's ``format``):

- ``s16le``: signed 16-bit integers, scaled by 1/32768 to [-1, 1).
- ``f32le``: 32-bit IEEE floats, nominally in [-1, 1].

Browsers' Web Audio graphs may overshoot full scale a little (resampling and gain stages are
not clipped), so ``f32le`` accepts magnitudes up to ``F32_MAX_ABS`` (2.0, i.e. 6 dB above full
scale) and clips them to [-1, 1]. Anything larger is not audio a microphone produced but a
client bug (int16 values sent as floats, garbage bytes) and is refused, as are NaN and inf.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np

PcmFormat = Literal["s16le", "f32le"]

PCM_FORMATS: tuple[str, ...] = get_args(PcmFormat)
"""Every format `decode_pcm` accepts."""

F32_MAX_ABS = 2.0
"""Largest |sample| accepted in ``f32le`` input; values in (1, F32_MAX_ABS] are clipped."""

MIN_SAMPLE_RATE = 8000
"""Lowest accepted client sample rate in Hz (telephone band)."""

MAX_SAMPLE_RATE = 192000
"""Highest accepted client sample rate in Hz (the highest rate audio hardware offers)."""

_DTYPES: dict[str, np.dtype] = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
_S16_SCALE = np.float32(1.0 / 32768.0)


def bytes_per_sample(fmt: str) -> int:
    """Size in bytes of one mono sample of ``fmt``.

    Raises:
        ValueError: ``fmt`` is not one of `PCM_FORMATS`.
    """
    return _dtype_of(fmt).itemsize


def decode_pcm(data: bytes | bytearray | memoryview, fmt: str) -> np.ndarray:
    """Decode one frame of mono little-endian PCM into float32 samples.

    Args:
        data: the raw bytes of a whole number of samples (may be empty).
        fmt: ``"s16le"`` or ``"f32le"``.

    Returns:
        (N,) float32 in [-1, 1], N = len(data) // bytes_per_sample(fmt). A fresh array the
        caller owns (never a view of ``data``).

    Raises:
        ValueError: unknown ``fmt``; a byte count that is not a multiple of the sample size;
            ``f32le`` samples that are NaN, infinite or larger in magnitude than `F32_MAX_ABS`.
    """
    dtype = _dtype_of(fmt)
    num_bytes = len(data)
    if num_bytes % dtype.itemsize:
        raise ValueError(
            f"{fmt} frame of {num_bytes} bytes is not a whole number of "
            f"{dtype.itemsize}-byte samples ({num_bytes % dtype.itemsize} bytes left over)"
        )
    raw = np.frombuffer(data, dtype=dtype)  # (N,) read-only view of data
    if fmt == "s16le":
        samples = raw.astype(np.float32)  # (N,) owned copy
        samples *= _S16_SCALE
        return samples
    return _checked_f32(raw)


def _checked_f32(raw: np.ndarray) -> np.ndarray:
    samples = raw.astype(np.float32)  # native byte order, owned copy
    if samples.size == 0:
        return samples
    finite = np.isfinite(samples)
    if not finite.all():
        first = int(np.argmin(finite))
        raise ValueError(
            f"f32le frame has {int(samples.size - finite.sum())} non-finite samples "
            f"(first at index {first}: {samples[first]})"
        )
    peak = float(np.max(np.abs(samples)))
    if peak > F32_MAX_ABS:
        raise ValueError(
            f"f32le sample magnitude {peak:g} exceeds {F32_MAX_ABS:g}; float PCM must be "
            f"in [-1, 1] (were int16 values sent as floats?)"
        )
    if peak > 1.0:
        np.clip(samples, -1.0, 1.0, out=samples)
    return samples


def _dtype_of(fmt: str) -> np.dtype:
    try:
        return _DTYPES[fmt]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown PCM format {fmt!r}; expected one of {', '.join(PCM_FORMATS)}"
        ) from None


def validate_sample_rate(sample_rate: object) -> int:
    """Check a client-declared sample rate and return it as an int.

    Accepts whole numbers of Hz from `MIN_SAMPLE_RATE` (8000) to `MAX_SAMPLE_RATE` (192000)
    inclusive, given as an int or an integral float (JSON numbers such as ``48000.0``).

    Raises:
        ValueError: not a number, a bool, a non-integral or non-finite number, or out of range.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | float):
        raise ValueError(
            f"sample rate must be a number of Hz, got {type(sample_rate).__name__} {sample_rate!r}"
        )
    if isinstance(sample_rate, float) and not (
        math.isfinite(sample_rate) and sample_rate.is_integer()
    ):
        raise ValueError(f"sample rate must be a whole number of Hz, got {sample_rate!r}")
    rate = int(sample_rate)
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise ValueError(
            f"sample rate {rate} Hz is outside the supported range "
            f"{MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz"
        )
    return rate
