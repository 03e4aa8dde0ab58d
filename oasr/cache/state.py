"""Fixed-extent, slot-addressed stream state: the slot pool and declared per-stream tensors."""

from __future__ import annotations

import heapq


class StreamSlotPool:
    """Hands out stream slots ``[0, num_slots)``, lowest free slot first.

    A slot is the row a stream owns in every slot-addressed tensor (block table, cache lengths,
    conv cache, declared states). A min-heap of free slots makes allocation deterministic (the
    lowest free id) and O(log n); a parallel flag per slot detects double frees.
    """

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self.num_slots = num_slots
        self._free = list(range(num_slots))
        self._is_free = [True] * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def is_free(self, slot: int) -> bool:
        """True when ``slot`` is in range and not handed out."""
        self._check_range(slot)
        return self._is_free[slot]

    def allocate(self) -> int:
        """The lowest free slot.

        Raises:
            RuntimeError: every slot is in use.
        """
        if not self._free:
            raise RuntimeError(f"no free stream slot: all {self.num_slots} slots are in use")
        slot = heapq.heappop(self._free)
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        """Return ``slot`` to the pool.

        Raises:
            ValueError: slot out of range or already free.
        """
        self._check_range(slot)
        if self._is_free[slot]:
            raise ValueError(f"double free of stream slot {slot}: it is already free")
        self._is_free[slot] = True
        heapq.heappush(self._free, slot)

    def _check_range(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.num_slots:
            raise ValueError(f"stream slot {slot!r} out of range: slots are 0..{self.num_slots - 1}")
