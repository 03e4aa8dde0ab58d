"""Fixed-extent, slot-addressed stream state: one persistent tensor per declared spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from oasr.cache.slots import SlotBindings, padded_slot_list, slots_to_device
from oasr.cache.state_spec import StreamStateSpec


class StateView(Protocol):
    """What a chunk forward reads and writes one declared state through, by name:
    ``cached = states[name].gather(); ...; states[name].scatter(new)``."""

    def gather(self) -> torch.Tensor:
        """The batch's rows, the spec's stored layout with B rows on its slot axis."""
        ...

    def scatter(self, new: torch.Tensor) -> None:
        """The batch's new rows, the same shape."""
        ...


class HeldState:
    """A `StateView` over a tensor its caller holds: ``gather`` returns it, ``scatter`` keeps
    the new one in ``value``. For entry points that take and return a batch's state as plain
    tensors (the specification's per-stream examples), outside any `SlotStateCache`."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def gather(self) -> torch.Tensor:
        return self.value

    def scatter(self, new: torch.Tensor) -> None:
        self.value = new


class SlotStateView:
    """One spec's rows for one batch: ``gather`` reads them, ``scatter`` writes them.

    ``gather()`` has the stored layout with the slot axis narrowed to the batch's B rows, e.g.
    (B, *shape) for ``slot_axis=0``; ``scatter(new)`` takes the same shape. A view made with
    ``staged`` (a dict) does not write the buffer: ``scatter`` puts ``new`` in
    ``staged[spec.name]``, and the caller writes it later with `SlotStateCache.write_rows`,
    once the whole chunk has succeeded (the engine's step commits state only then).
    """

    def __init__(self, spec: StreamStateSpec, buffer: torch.Tensor, slots: torch.Tensor,
                 staged: dict[str, torch.Tensor] | None = None) -> None:
        self.spec = spec
        self.buffer = buffer
        self.slots = slots
        self.staged = staged

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.spec.stored_shape(self.slots.numel())

    def gather(self) -> torch.Tensor:
        """A new tensor of the batch's rows, shape ``batch_shape``."""
        return self.buffer.index_select(self.spec.slot_axis, self.slots)

    def scatter(self, new: torch.Tensor) -> None:
        """Write the batch's rows back (in place, no allocation in the buffer), or stage them
        (a view made with ``staged``: nothing is written).

        Raises:
            ValueError: ``new`` is not ``batch_shape``.
        """
        if tuple(new.shape) != self.batch_shape:
            raise ValueError(
                f"state {self.spec.name!r}: scatter got shape {tuple(new.shape)}, expected "
                f"{self.batch_shape}"
            )
        if self.staged is not None:
            self.staged[self.spec.name] = new
            return
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
        self.buffers = {
            s.name: torch.zeros(s.stored_shape(self.num_rows), dtype=s.dtype or dtype, device=self.device)
            for s in specs
        }
        self._bindings = SlotBindings(num_slots)

    @property
    def pad_lane_slots(self) -> tuple[int, ...]:
        return tuple(range(self.num_slots, self.num_rows))

    @property
    def stream_ids(self) -> list[int]:
        return self._bindings.stream_ids

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._bindings

    def allocate_stream(self, stream_id: int, slot: int | None = None) -> int:
        """Bind a stream to a slot (the caller's, or the lowest unbound one) and zero the slot.

        Raises:
            ValueError: duplicate stream id, or a slot out of range or already bound.
            RuntimeError: no slot given and none unbound.
        """
        slot = self._bindings.bind(stream_id, slot)
        self._zero_slot(slot, keep_persistent=False)
        return slot

    def free_stream(self, stream_id: int) -> None:
        """Unbind the stream; its rows keep their values until the slot's next stream."""
        self._bindings.unbind(self._check_stream(stream_id))

    def reset_stream(self, stream_id: int) -> None:
        """Zero the stream's non-persistent state in place (an endpoint); the slot is kept."""
        self._zero_slot(self.slot_of(stream_id), keep_persistent=True)

    def _zero_slot(self, slot: int, keep_persistent: bool) -> None:
        for name, spec in self.specs.items():
            if not (keep_persistent and spec.persistent):
                self.buffers[name].select(spec.slot_axis, slot).zero_()

    def _check_stream(self, stream_id: int) -> int:
        if stream_id not in self._bindings:
            raise KeyError(f"stream {stream_id} is not allocated in this state cache")
        return stream_id

    def slot_of(self, stream_id: int) -> int:
        return self._bindings.slot_of(self._check_stream(stream_id))

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

    def views_for_slots(
        self, slots: torch.Tensor, staged: dict[str, torch.Tensor] | None = None
    ) -> dict[str, SlotStateView]:
        """A gather/scatter view per spec for rows given as a (B,) int64 device slots tensor;
        with ``staged``, their scatters fill that dict instead of writing (see
        `SlotStateView`)."""
        return {name: SlotStateView(spec, self.buffers[name], slots, staged)
                for name, spec in self.specs.items()}

    def write_rows(self, slots: torch.Tensor, values: Mapping[str, torch.Tensor],
                   rows: torch.Tensor | None = None) -> None:
        """Write staged state into the buffers: row ``rows[i]`` of each ``values[name]`` (on the
        spec's slot axis) into slot ``slots[i]``.

        Args:
            slots: (N,) int64 device slots to write.
            values: per spec name, a batch's new state in the stored layout with B >= N rows on
                the slot axis (what a staged view's ``scatter`` was given).
            rows: (N,) int64 device rows of ``values`` to take; None takes rows 0..N-1.
        Raises:
            KeyError: a name that is not declared. ValueError: a wrong shape.
        """
        for name, value in values.items():
            spec = self._spec(name)
            if rows is not None:
                value = value.index_select(spec.slot_axis, rows)
            elif value.size(spec.slot_axis) != slots.numel():
                value = value.narrow(spec.slot_axis, 0, slots.numel())
            SlotStateView(spec, self.buffers[name], slots).scatter(value)
