"""``StreamStateSpec``: the declaration of one fixed-extent, slot-addressed per-stream tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StreamStateSpec:
    """Declaration of one fixed-extent per-stream tensor.

    Attributes:
        name: key the encoder reads the state back by.
        shape: one stream's shape, without the slot axis.
        slot_axis: where the slot axis sits in the stored tensor (0..len(shape)); the stored
            tensor is ``shape[:slot_axis] + (num_rows,) + shape[slot_axis:]``.
        persistent: describes the request, not the audio: ``reset_stream`` keeps it.
        dtype: element type; None takes the cache's dtype.
    """

    name: str
    shape: tuple[int, ...]
    slot_axis: int = 0
    persistent: bool = False
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("StreamStateSpec.name must be a non-empty string")
        object.__setattr__(self, "shape", tuple(self.shape))
        if any(not isinstance(d, int) or d < 1 for d in self.shape):
            raise ValueError(f"StreamStateSpec {self.name!r}: shape {self.shape} must be positive ints")
        if not 0 <= self.slot_axis <= len(self.shape):
            raise ValueError(
                f"StreamStateSpec {self.name!r}: slot_axis {self.slot_axis} out of range "
                f"0..{len(self.shape)} for shape {self.shape}"
            )

    def stored_shape(self, num_rows: int) -> tuple[int, ...]:
        """Shape of the persistent tensor holding ``num_rows`` slots."""
        return (*self.shape[: self.slot_axis], num_rows, *self.shape[self.slot_axis :])
