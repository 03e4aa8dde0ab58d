"""Geometry of the Whisper-encoder CTC model (oasr's second encoder family)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from oasr.models.bundled import BUNDLED_UNITS

_POSITIVE = ("n_mels", "width", "heads", "layers", "max_positions", "vocab_size", "chunk_frames")


@dataclass(frozen=True)
class WhisperCtcConfig:
    """Shapes of a chunk-causal Whisper encoder with a linear CTC head (tiny.en geometry).

    Attributes:
        n_mels: log-mel bins of the input.
        width: encoder width.
        heads: attention heads (``width`` must divide by it).
        layers: encoder blocks.
        max_positions: encoder frames with a stored position (1500 x 20 ms = 30 s); a stream
            must be reset before it reaches them.
        vocab_size: CTC output units (the bundled character set, blank included).
        chunk_frames: encoder frames per serving chunk (32 x 20 ms = 640 ms).
    """

    n_mels: int = 80
    width: int = 384
    heads: int = 6
    layers: int = 4
    max_positions: int = 1500
    vocab_size: int = len(BUNDLED_UNITS)
    chunk_frames: int = 32

    subsampling = 2  # mel frames per encoder frame (conv2's stride)
    frame_shift_s = 0.02  # seconds per encoder frame

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WhisperCtcConfig.{name} must be a positive int, got {value!r}")
        if self.width % self.heads:
            raise ValueError(
                f"WhisperCtcConfig: width ({self.width}) is not divisible by heads ({self.heads})"
            )

    @property
    def head_dim(self) -> int:
        """Per-head dimension of Q, K and V."""
        return self.width // self.heads

    def to_dict(self) -> dict[str, int]:
        """The fields as a JSON-ready dict (the class constants are not fields)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WhisperCtcConfig:
        """Build from ``to_dict()`` output; unknown keys are a ``ValueError``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown WhisperCtcConfig keys {unknown}; known: {sorted(known)}")
        return cls(**raw)
