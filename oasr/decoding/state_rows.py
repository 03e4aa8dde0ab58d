"""`StateRows`: persistent storage for many batch-1 decoder states, one row each.

The engine decodes B streams per step, each with its own pooled batch-1 `DecoderState`.
Keeping those states as separate tensors means concatenating every field of every state
before each batched search and splitting the result after (B x 11 tensors per step). Here
every batch-1 state a decoder creates is instead a set of views of row ``pool_row`` of one
B_max-row `DecoderState`: a step gathers the cohort's rows with one ``index_select`` per field,
searches, and writes them back with one ``index_copy_`` per field, whatever B is.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from oasr.decoding.state import (
    TENSOR_FIELDS,
    DecoderState,
    new_state,
    pad_capacity,
    reset_in_place,
)


class StateRows:
    """Row storage behind the batch-1 states of one decoder.

    Invariant: every live attached state's tensor fields are the ``[row : row + 1]`` views of
    ``storage``'s fields at its ``pool_row``, and rows not attached to a live state are in the
    free list. Growing the storage (more rows, or wider token buffers) re-points every live
    state's views, so a state object stays valid for its whole life. A row is released when
    its state is garbage collected (the pool keeps only weak references).
    """

    def __init__(self, beam_size: int, capacity: int, blank_id: int, device: torch.device,
                 num_rows: int = 8) -> None:
        self.beam_size = beam_size
        self.blank_id = blank_id
        self.device = device
        self.storage = new_state(num_rows, beam_size, capacity, blank_id, device)
        self._free = list(range(num_rows - 1, -1, -1))  # pop() hands out row 0 first
        self._owners: dict[int, tuple[weakref.ref[DecoderState], weakref.finalize]] = {}
        self._index_cache: tuple[tuple[int, ...], torch.Tensor] | None = None

    @property
    def num_rows(self) -> int:
        return self.storage.batch_size

    @property
    def num_attached(self) -> int:
        return len(self._owners)

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def attach(self) -> DecoderState:
        """A fresh batch-1 state living in a free row (the storage doubles when none is free)."""
        if not self._free:
            self._grow_rows(2 * self.num_rows)
        row = self._free.pop()
        state = DecoderState(**self._views(row), pool_row=row)
        reset_in_place(state, self.blank_id)
        self._owners[row] = (weakref.ref(state), weakref.finalize(state, self._release, row))
        return state

    def detach(self, state: DecoderState) -> None:
        """Give ``state`` tensors of its own (a copy of its row) and free the row."""
        row = self._row_of(state)
        assert row is not None, "detach of a state this storage does not hold"
        for name in TENSOR_FIELDS:
            setattr(state, name, getattr(state, name).clone())
        state.pool_row = None
        self._owners[row][1].detach()  # the row may belong to another state when this one dies
        self._release(row)

    def rows_of(self, states: list[DecoderState]) -> list[int] | None:
        """The rows of ``states``, or None unless all of them live here.

        Raises:
            ValueError: one state appears twice (its row would be searched twice).
        """
        rows = []
        for state in states:
            row = self._row_of(state)
            if row is None:
                return None
            rows.append(row)
        if len(set(rows)) != len(rows):
            first = next(i for i, r in enumerate(rows) if rows.count(r) > 1)
            raise ValueError(f"the state at position {first} is passed more than once")
        return rows

    def holds(self, state: DecoderState) -> bool:
        """Whether ``state`` is a live row of this storage."""
        return self._row_of(state) is not None

    def write_back(self, state: DecoderState) -> None:
        """Store the tensors a searched state of this storage was handed (by the stack /
        split path) in its row, and make its fields views of the row again."""
        row = self._row_of(state)
        assert row is not None, "write_back of a state this storage does not hold"
        values = {n: getattr(state, n) for n in TENSOR_FIELDS}
        if values["tokens"].shape[-1] > self.capacity:
            self._grow_capacity(values["tokens"].shape[-1])
        for name, value in values.items():
            view = getattr(self.storage, name)[row : row + 1]
            view[..., : value.shape[-1]].copy_(value)
            setattr(state, name, view)

    def index(self, rows: list[int]) -> torch.Tensor:
        """(B,) int64 device tensor of ``rows``; the last one is reused while the cohort is
        unchanged, so a steady step copies no index to the device."""
        key = tuple(rows)
        if self._index_cache is None or self._index_cache[0] != key:
            staged = torch.tensor(rows, dtype=torch.int64)
            if torch.device(self.device).type == "cuda":  # pinned: no wait for queued work
                staged = staged.pin_memory()
            self._index_cache = (key, staged.to(self.device, non_blocking=True))
        return self._index_cache[1]

    def ensure_capacity(self, states: list[DecoderState], index: torch.Tensor,
                        num_new_frames: int) -> None:
        """Widen the token buffers so ``num_new_frames`` more frames of every state fit.

        Reads the rows' exact prefix lengths back (a device sync) only when the host bounds
        say they may not fit.
        """
        if max(s.max_len_bound for s in states) + num_new_frames + 1 <= self.capacity:
            return
        lengths = self.storage.prefix_len.index_select(0, index).amax(dim=1).tolist()
        for state, length in zip(states, lengths, strict=True):
            state.max_len_bound = int(length)
        needed = max(lengths) + num_new_frames + 1
        if needed > self.capacity:
            self._grow_capacity(max(needed, 2 * self.capacity))

    def gather(self, index: torch.Tensor, max_len_bound: int) -> DecoderState:
        """A B-row working state holding copies of the rows ``index`` (B,)."""
        parts: dict[str, Any] = {
            n: getattr(self.storage, n).index_select(0, index) for n in TENSOR_FIELDS
        }
        return DecoderState(**parts, max_len_bound=max_len_bound)

    def scatter(self, index: torch.Tensor, work: DecoderState) -> None:
        """Write a working state's rows back to rows ``index`` (in place: views stay valid)."""
        for name in TENSOR_FIELDS:
            getattr(self.storage, name).index_copy_(0, index, getattr(work, name))

    def _row_of(self, state: DecoderState) -> int | None:
        row = state.pool_row
        if row is None:
            return None
        owner = self._owners.get(row)
        return row if owner is not None and owner[0]() is state else None

    def _views(self, row: int) -> dict[str, Any]:
        return {n: getattr(self.storage, n)[row : row + 1] for n in TENSOR_FIELDS}

    def _release(self, row: int) -> None:
        if self._owners.pop(row, None) is not None:
            self._free.append(row)

    def _repoint(self) -> None:
        for row, (ref, _) in list(self._owners.items()):
            state = ref()
            if state is not None:
                for name, view in self._views(row).items():
                    setattr(state, name, view)

    def _grow_rows(self, num_rows: int) -> None:
        old = self.storage
        grown = new_state(num_rows, self.beam_size, old.capacity, self.blank_id, self.device)
        for name in TENSOR_FIELDS:
            getattr(grown, name)[: old.batch_size].copy_(getattr(old, name))
        self.storage = grown
        self._free = list(range(num_rows - 1, old.batch_size - 1, -1)) + self._free
        self._index_cache = None
        self._repoint()

    def _grow_capacity(self, capacity: int) -> None:
        self.storage.tokens = pad_capacity(self.storage.tokens, capacity)
        self.storage.token_frames = pad_capacity(self.storage.token_frames, capacity)
        self._repoint()
