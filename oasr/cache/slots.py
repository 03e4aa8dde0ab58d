"""Stream slots: the row a stream owns in every slot-addressed tensor, and batch slot lists."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch


class StreamSlotPool:
    """Hands out stream slots ``[0, num_slots)``, lowest free slot first.

    A slot is the row a stream owns in every slot-addressed tensor (block table, cache lengths,
    conv cache, declared states, decoder state rows). One pool allocates it: the engine's
    ``StreamResources`` owns it and passes the slot to every manager, which only binds it
    (``SlotBindings``). A min-heap of free slots makes allocation deterministic (the lowest
    free id) and O(log n); a parallel flag per slot detects double frees.
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


def padded_slot_list(
    slots: Sequence[int], pad_to: int | None, pad_lane_slots: Sequence[int]
) -> list[int]:
    """``slots`` followed by pad-lane slots (cycled) up to ``pad_to`` rows.

    Raises:
        ValueError: padding asked for but there are no pad lanes.
    """
    out = list(slots)
    if pad_to is None or pad_to <= len(out):
        return out
    if not pad_lane_slots:
        raise ValueError(
            f"cannot pad a batch of {len(out)} to {pad_to}: there are no pad lanes "
            "(build the cache with pad_lanes=1)"
        )
    return out + [pad_lane_slots[i % len(pad_lane_slots)] for i in range(pad_to - len(out))]


def slots_to_device(slots: Sequence[int], device: torch.device) -> torch.Tensor:
    """(B,) int64 tensor of ``slots`` on ``device``: one copy, pinned and asynchronous on CUDA."""
    staged = torch.tensor(list(slots), dtype=torch.int64)
    if device.type == "cuda":
        staged = staged.pin_memory()
    return staged.to(device, non_blocking=True)


class SlotBindings:
    """Which stream holds which slot, in one manager of slot-addressed rows.

    A manager binds; it does not own the slots. The engine's ``StreamSlotPool`` allocates a
    stream's slot once and passes it to every manager (attention rows, conv and declared state,
    decoder rows), so all of them address the stream by the same row. A manager used on its
    own, as the specification's examples use it, binds the lowest slot it has not bound.
    Two dicts (stream -> slot and slot -> stream) make every check O(1).
    """

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self.num_slots = num_slots
        self._slot_of: dict[int, int] = {}
        self._stream_of: dict[int, int] = {}

    def bind(self, stream_id: int, slot: int | None = None) -> int:
        """Bind ``stream_id`` to ``slot`` (None: the lowest unbound slot); returns the slot.

        Raises:
            ValueError: the stream is already bound, or the slot is out of range or bound.
            RuntimeError: no slot is unbound.
        """
        if stream_id in self._slot_of:
            raise ValueError(
                f"stream {stream_id} is already allocated (slot {self._slot_of[stream_id]})"
            )
        if slot is None:
            slot = self._lowest_unbound()
        elif not isinstance(slot, int) or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot!r} out of range: streams use 0..{self.num_slots - 1}")
        elif slot in self._stream_of:
            raise ValueError(f"slot {slot} is already bound to stream {self._stream_of[slot]}")
        self._slot_of[stream_id] = slot
        self._stream_of[slot] = stream_id
        return slot

    def unbind(self, stream_id: int) -> int:
        """Forget the stream; returns the slot it held (a KeyError for an unknown stream)."""
        slot = self._slot_of.pop(stream_id)
        del self._stream_of[slot]
        return slot

    @property
    def stream_ids(self) -> list[int]:
        return list(self._slot_of)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._slot_of

    def slot_of(self, stream_id: int) -> int:
        """The stream's slot (a KeyError for an unknown stream)."""
        return self._slot_of[stream_id]

    def _lowest_unbound(self) -> int:
        for slot in range(self.num_slots):
            if slot not in self._stream_of:
                return slot
        raise RuntimeError(f"no free stream slot: all {self.num_slots} slots are in use")
