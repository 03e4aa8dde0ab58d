"""Fixed-extent, slot-addressed stream state: the slot pool and declared per-stream tensors."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch


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


class SlotStateView:
    """One spec's rows for one batch: ``gather`` reads them, ``scatter`` writes them in place.

    ``gather()`` has the stored layout with the slot axis narrowed to the batch's B rows, e.g.
    (B, *shape) for ``slot_axis=0``; ``scatter(new)`` takes the same shape.
    """

    def __init__(self, spec: StreamStateSpec, buffer: torch.Tensor, slots: torch.Tensor) -> None:
        self.spec = spec
        self.buffer = buffer
        self.slots = slots

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.spec.stored_shape(self.slots.numel())

    def gather(self) -> torch.Tensor:
        """A new tensor of the batch's rows, shape ``batch_shape``."""
        return self.buffer.index_select(self.spec.slot_axis, self.slots)

    def scatter(self, new: torch.Tensor) -> None:
        """Write the batch's rows back (in place, no allocation in the buffer).

        Raises:
            ValueError: ``new`` is not ``batch_shape``.
        """
        if tuple(new.shape) != self.batch_shape:
            raise ValueError(
                f"state {self.spec.name!r}: scatter got shape {tuple(new.shape)}, expected "
                f"{self.batch_shape}"
            )
        self.buffer.index_copy_(self.spec.slot_axis, self.slots, new.to(self.buffer.dtype))


class SlotStateCache:
    """Fixed-extent per-stream state: one persistent tensor per declared spec, slot-addressed.

    Each spec's tensor holds ``num_slots + pad_lanes`` rows on its own ``slot_axis``, allocated
    once (stable addresses). A stream is bound to a slot; allocation zeroes the slot in every
    tensor, and zero is the initial value (a zero left context is the padding an offline pass
    applies). ``reset_stream`` zeroes every non-persistent spec and keeps persistent ones. Pad
    lanes (rows past ``num_slots``) are never bound to a stream; padded batches read and write
    them so padding never touches a stream's row.
    """

    def __init__(
        self,
        specs: Sequence[StreamStateSpec],
        num_slots: int,
        device: torch.device | str,
        dtype: torch.dtype,
        pad_lanes: int = 0,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"state spec names repeat: {names}")
        if not isinstance(pad_lanes, int) or pad_lanes < 0:
            raise ValueError(f"pad_lanes must be an int >= 0, got {pad_lanes!r}")
        self.specs = {s.name: s for s in specs}
        self.device = torch.device(device)
        self.num_slots = num_slots
        self.num_rows = num_slots + pad_lanes
        self.slot_pool = StreamSlotPool(num_slots)
        self.buffers = {
            s.name: torch.zeros(s.stored_shape(self.num_rows), dtype=s.dtype or dtype, device=self.device)
            for s in specs
        }
        self._slots: dict[int, tuple[int, bool]] = {}  # stream id -> (slot, owns_slot)

    @property
    def pad_lane_slots(self) -> tuple[int, ...]:
        return tuple(range(self.num_slots, self.num_rows))

    @property
    def stream_ids(self) -> list[int]:
        return list(self._slots)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._slots

    def allocate_stream(self, stream_id: int, slot: int | None = None) -> int:
        """Bind a stream to a slot (the lowest free one, or the caller's) and zero the slot.

        Raises:
            ValueError: duplicate stream id, or a caller slot out of range or already bound.
            RuntimeError: no free slot.
        """
        if stream_id in self._slots:
            raise ValueError(f"stream {stream_id} is already allocated (slot {self.slot_of(stream_id)})")
        if slot is None:
            bound = (self.slot_pool.allocate(), True)
        else:
            self._check_caller_slot(slot)
            bound = (slot, False)
        self._slots[stream_id] = bound
        self._zero_slot(bound[0], keep_persistent=False)
        return bound[0]

    def _check_caller_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot!r} out of range: streams use 0..{self.num_slots - 1}")
        for sid, (other, _) in self._slots.items():
            if other == slot:
                raise ValueError(f"slot {slot} is already bound to stream {sid}")

    def free_stream(self, stream_id: int) -> None:
        """Unbind the stream; its slot returns to the slot pool if this cache allocated it."""
        slot, owns = self._slots.pop(self._check_stream(stream_id))
        if owns:
            self.slot_pool.free(slot)

    def reset_stream(self, stream_id: int) -> None:
        """Zero the stream's non-persistent state in place (an endpoint); the slot is kept."""
        self._zero_slot(self.slot_of(stream_id), keep_persistent=True)

    def _zero_slot(self, slot: int, keep_persistent: bool) -> None:
        for name, spec in self.specs.items():
            if not (keep_persistent and spec.persistent):
                self.buffers[name].select(spec.slot_axis, slot).zero_()

    def _check_stream(self, stream_id: int) -> int:
        if stream_id not in self._slots:
            raise KeyError(f"stream {stream_id} is not allocated in this state cache")
        return stream_id

    def slot_of(self, stream_id: int) -> int:
        return self._slots[self._check_stream(stream_id)][0]

    def fill_slot(self, stream_id: int, name: str, value: float) -> None:
        """Set every element of the stream's ``name`` state to ``value`` (a fill, no host copy)."""
        spec = self._spec(name)
        self.buffers[name].select(spec.slot_axis, self.slot_of(stream_id)).fill_(value)

    def slot_view(self, stream_id: int, name: str) -> torch.Tensor:
        """The stream's rows of ``name`` as a view keeping a size-1 slot axis."""
        spec = self._spec(name)
        return self.buffers[name].narrow(spec.slot_axis, self.slot_of(stream_id), 1)

    def _spec(self, name: str) -> StreamStateSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise KeyError(f"no state named {name!r}; declared: {sorted(self.specs)}") from None

    def batch_slot_list(self, stream_ids: Sequence[int], pad_to: int | None = None) -> list[int]:
        """The streams' slots, then pad lanes up to ``pad_to`` rows."""
        return padded_slot_list([self.slot_of(s) for s in stream_ids], pad_to, self.pad_lane_slots)

    def views(
        self, stream_ids: Sequence[int], pad_to: int | None = None
    ) -> dict[str, SlotStateView]:
        """A gather/scatter view per spec for the batch, sharing one device slots tensor."""
        slots = slots_to_device(self.batch_slot_list(stream_ids, pad_to), self.device)
        return self.views_for_slots(slots)

    def views_for_slots(self, slots: torch.Tensor) -> dict[str, SlotStateView]:
        """A gather/scatter view per spec for rows given as a (B,) int64 device slots tensor."""
        return {name: SlotStateView(spec, self.buffers[name], slots) for name, spec in self.specs.items()}
