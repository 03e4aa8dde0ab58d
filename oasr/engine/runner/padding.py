"""The padding lane's policy: which width a cohort runs at and which host ints fix its shapes.

A CUDA graph replays fixed shapes, so a step served by graphs must present the same shapes
for many cohorts. Four host-side numbers decide every tensor shape of a chunk step: the rows
(B), the feature frames per row (T), the longest held K/V history (``host_seqlen``, which
sizes the paged gather) and the largest stream offset (``max_offset``, which sizes the
Conformer's relative-position table). `StepPadding` rounds each of them up to a small set of
values: B to the next width of a power-of-two ladder (the extra rows are pad-lane rows that
write only into the pool's scratch block and the state caches' pad row), T to the family's
full window, the gather to a power-of-two number of blocks and the position table to a
power-of-two length. Rounding up never changes a real row's result: a longer gather adds key
columns the mask gives zero weight, a longer table adds positions no key reaches, a longer
window adds frames past the row's ``feat_lens``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class WidthLadder:
    """The batch widths a step may run at: 1, 2, 4, ... below ``max_width``, then ``max_width``.

    Attributes:
        max_width: the widest cohort (the engine's ``max_batch_size``).
    """

    max_width: int

    def __post_init__(self) -> None:
        if not isinstance(self.max_width, int) or self.max_width < 1:
            raise ValueError(f"WidthLadder.max_width must be an int >= 1, got {self.max_width!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """Every width, ascending (``ceil(log2(max_width)) + 1`` of them)."""
        powers = [1 << i for i in range(self.max_width.bit_length()) if 1 << i < self.max_width]
        return (*powers, self.max_width)

    def width_for(self, batch: int) -> int:
        """The narrowest width holding ``batch`` rows.

        Raises:
            ValueError: ``batch`` outside 1..max_width.
        """
        if not 1 <= batch <= self.max_width:
            raise ValueError(f"a cohort of {batch} rows does not fit the ladder 1..{self.max_width}")
        return min(self.max_width, _next_power_of_two(batch))


@dataclass(frozen=True)
class StepShape:
    """The host ints that fix every tensor shape of one chunk step (a captured graph's key).

    Attributes:
        width: rows, pad rows included.
        frames: feature frames per row (T of the (width, T, F) features).
        host_seqlen: the K/V history the paged gather is sized for (>= every row's).
        max_offset: the offset the position table is sized for (>= every row's), or 0 for a
            family whose shapes ignore offsets.
    """

    width: int
    frames: int
    host_seqlen: int
    max_offset: int

    def __post_init__(self) -> None:
        if self.width < 1 or self.frames < 1 or self.host_seqlen < 0 or self.max_offset < 0:
            raise ValueError(f"invalid step shape {self}")


@dataclass(frozen=True)
class StepPadding:
    """How a padded step rounds its shapes up (see the module docstring).

    Attributes:
        ladder: the batch widths.
        window_frames: feature frames of a full window (every row is padded to it).
        chunk_size: encoder frames a full window makes (the query frames of the gather).
        block_size: frames per K/V block.
        max_blocks_per_seq: the block table's width (the gather never exceeds it).
        offset_sized_positions: the family's position table grows with ``max_offset`` (the
            Conformer's relative table); otherwise the offset only guards a fixed table.
        max_positions: the family's position limit, or None for none.
    """

    ladder: WidthLadder
    window_frames: int
    chunk_size: int
    block_size: int
    max_blocks_per_seq: int
    offset_sized_positions: bool
    max_positions: int | None

    def __post_init__(self) -> None:
        for name in ("window_frames", "chunk_size", "block_size", "max_blocks_per_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"StepPadding.{name} must be >= 1, got {getattr(self, name)}")

    def shape(self, batch: int, host_seqlen: int, max_offset: int) -> StepShape:
        """The padded shape of a cohort of ``batch`` rows whose longest history is
        ``host_seqlen`` frames and largest offset ``max_offset``."""
        needed = math.ceil((host_seqlen + self.chunk_size) / self.block_size)
        blocks = min(_next_power_of_two(needed), self.max_blocks_per_seq)
        seqlen = max(host_seqlen, blocks * self.block_size - self.chunk_size)
        if self.offset_sized_positions:
            offset = _next_power_of_two(max_offset + self.chunk_size) - self.chunk_size
        elif self.max_positions is not None:  # the largest offset the engine lets through
            offset = max(max_offset, self.max_positions - self.chunk_size)
        else:
            offset = 0  # the family's shapes ignore offsets
        return StepShape(self.ladder.width_for(batch), self.window_frames, seqlen, offset)
