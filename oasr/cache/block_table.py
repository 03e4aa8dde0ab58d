"""Slot-addressed device tables of the paged K/V cache: ``block_table``, ``cache_seqlens`` and
``cache_starts``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oasr.cache.host_mirror import HostMirroredTable
from oasr.cache.types import CacheConfig


class BlockTables:
    """One block-table row, one cache length and one history start per slot, plus pad lanes.

    ``block_table`` is (max_batch_size + pad_lanes, max_blocks_per_seq) int32,
    ``cache_seqlens`` and ``cache_starts`` (max_batch_size + pad_lanes,) int32 (frames a row
    spans; the first of them that is history), all persistent on the config's device. Every
    edit goes to a host mirror; ``flush`` copies the changed rows in one copy per table (no
    Python scalar is written through an index into a device tensor). Pad-lane rows point only
    at a scratch block, at ``pad_seqlen`` frames from frame 0, and are never edited afterwards.
    """

    def __init__(
        self, config: CacheConfig, pad_lanes: int, scratch_ids: Sequence[int], pad_seqlen: int
    ) -> None:
        if pad_lanes and not scratch_ids:
            raise ValueError(
                f"pad_lanes={pad_lanes} needs a scratch block to point at: build the pool with "
                "BlockPool(config, scratch_blocks=1)"
            )
        self.device = config.device
        self.num_slots = config.max_batch_size
        self.num_rows = config.max_batch_size + pad_lanes
        self._table = HostMirroredTable((self.num_rows, config.max_blocks_per_seq), config.device)
        self._seqlens = HostMirroredTable((self.num_rows,), config.device)
        self._starts = HostMirroredTable((self.num_rows,), config.device)
        for lane, row in enumerate(self.pad_lane_slots):
            self._table.host[row, :] = scratch_ids[lane % len(scratch_ids)]
            self._seqlens.host[row] = pad_seqlen
            self._table.mark_dirty(row)
            self._seqlens.mark_dirty(row)

    @property
    def pad_lane_slots(self) -> tuple[int, ...]:
        """Rows past ``max_batch_size``; a batch is padded with them."""
        return tuple(range(self.num_slots, self.num_rows))

    def write(self, slot: int, start: int, block_ids: Sequence[int]) -> None:
        """Row ``slot``, columns ``start:start + len(block_ids)`` := ``block_ids``."""
        if not block_ids:
            return
        self._table.host[slot, start : start + len(block_ids)] = block_ids
        self._table.mark_dirty(slot)

    def shift_left(self, slot: int, n: int, num_kept: int) -> None:
        """Drop the first ``n`` entries of a row holding ``n + num_kept``; zero the vacated ones."""
        row = self._table.host[slot]
        row[:num_kept] = row[n : n + num_kept]
        row[num_kept : num_kept + n] = 0
        self._table.mark_dirty(slot)

    def truncate(self, slot: int, num_kept: int, n: int) -> None:
        """Zero entries ``num_kept .. num_kept + n - 1`` of a row (blocks given back)."""
        self._table.host[slot, num_kept : num_kept + n] = 0
        self._table.mark_dirty(slot)

    def clear(self, slot: int) -> None:
        """Zero the whole block-table row of ``slot``."""
        self._table.host[slot, :] = 0
        self._table.mark_dirty(slot)

    def set_seqlen(self, slot: int, frames: int) -> None:
        self._seqlens.host[slot] = frames
        self._seqlens.mark_dirty(slot)

    def set_start(self, slot: int, frame: int) -> None:
        """The row's first frame of history (frames before it were evicted)."""
        if int(self._starts.host[slot]) != frame:
            self._starts.host[slot] = frame
            self._starts.mark_dirty(slot)

    def host_row(self, slot: int) -> list[int]:
        """The host mirror of one block-table row (what the device holds after a flush)."""
        return self._table.host[slot].tolist()

    def flush(self) -> None:
        """Bring both device tables up to date (at most one copy each)."""
        self._table.flush()
        self._seqlens.flush()
        self._starts.flush()

    @property
    def block_table(self) -> torch.Tensor:
        """(num_rows, max_blocks_per_seq) int32 device table, flushed."""
        self.flush()
        return self._table.device

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """(num_rows,) int32 device cache lengths, flushed."""
        self.flush()
        return self._seqlens.device

    @property
    def cache_starts(self) -> torch.Tensor:
        """(num_rows,) int32 device history starts, flushed."""
        self.flush()
        return self._starts.device

    def gather_starts(self, slots: torch.Tensor) -> torch.Tensor:
        """(B,) int32 history starts of the rows ``slots`` (flushed)."""
        self.flush()
        return self._starts.device.index_select(0, slots)

    def row_views(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, max_blocks_per_seq) and (1,) views of one slot's rows (flushed)."""
        self.flush()
        return self._table.device[slot : slot + 1], self._seqlens.device[slot : slot + 1]

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``slots`` (B,): block_table (B, max_blocks_per_seq), cache_seqlens (B,)."""
        self.flush()
        return self._table.device.index_select(0, slots), self._seqlens.device.index_select(0, slots)
