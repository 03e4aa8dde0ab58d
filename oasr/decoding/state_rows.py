"""`StateRows`: persistent storage for many batch-1 decoder states, one row each.

The engine decodes B streams per step, each with its own batch-1 `DecoderState`. Keeping
those states as separate tensors means concatenating every field of every state before each
batched search and splitting the result after (B x 11 tensors per step). Here every batch-1
state a decoder creates is instead a set of views of row ``pool_row`` of one B_max-row
`DecoderState`: a step gathers the cohort's rows with one ``index_select`` per field,
searches, and writes them back with one ``index_copy_`` per field, whatever B is.

Rows are addressed by the caller: the engine passes a stream's slot, so a stream's decoder
row is its slot (the same row as its block-table and conv-cache rows), and frees it
explicitly on the engine thread when the stream closes.

The engine builds the storage ``fixed``: a row per slot and token buffers for the longest
segment it lets a stream decode, allocated once, so admitting a stream or growing its
hypotheses never reallocates or copies a live row. A storage built without ``fixed`` (a
decoder used on its own) starts small and grows.
"""

from __future__ import annotations

from typing import Any

import torch

from oasr.decoding.state import (
    TENSOR_FIELDS,
    DecoderState,
    new_state,
    pad_capacity,
    reset_in_place,
)

TOKEN_FIELDS = ("tokens", "token_frames")  # (rows, K, capacity): the fields with a token axis


class StateRows:
    """Row storage behind the batch-1 states of one decoder.

    Invariant: every attached state's tensor fields are the ``[row : row + 1]`` views of
    ``storage``'s fields at its ``pool_row``, and ``_states`` maps each attached row to its
    state (one state per row). Growing the storage (more rows, or wider token buffers)
    re-points every attached state's views, so a state object stays valid until its row is
    released. A row is released only by `release` (no finalizer: a state that is dropped
    without being released keeps its row); a released state's fields become empty views, so
    a use after the free fails instead of touching the row's next owner.
    """

    def __init__(self, beam_size: int, capacity: int, blank_id: int, device: torch.device,
                 num_rows: int = 8, fixed: bool = False) -> None:
        """
        Args:
            capacity: token columns of each hypothesis (the longest prefix plus one scratch
                column).
            num_rows: rows allocated now.
            fixed: never grow: a row past ``num_rows`` or a prefix past ``capacity - 1``
                tokens is an error instead of a reallocation.
        """
        self.beam_size = beam_size
        self.blank_id = blank_id
        self.device = device
        self.fixed = fixed
        self.storage = new_state(num_rows, beam_size, capacity, blank_id, device)
        self._states: dict[int, DecoderState] = {}
        self._index_cache: tuple[tuple[int, ...], torch.Tensor] | None = None

    @property
    def num_rows(self) -> int:
        return self.storage.batch_size

    @property
    def num_attached(self) -> int:
        return len(self._states)

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def attach(self, row: int | None = None) -> DecoderState:
        """A fresh batch-1 state living in ``row`` (None: the lowest row not attached); a
        storage that is not ``fixed`` grows to hold the row.

        Raises:
            ValueError: ``row`` negative or already attached to a state; a ``fixed`` storage
                with no such row (or, for None, no free row).
        """
        if row is None:
            row = next(r for r in range(self.num_rows + 1) if r not in self._states)
        elif not isinstance(row, int) or row < 0:
            raise ValueError(f"decoder row must be an int >= 0, got {row!r}")
        elif row in self._states:
            raise ValueError(f"decoder row {row} is already held by a live state")
        if row >= self.num_rows:
            if self.fixed:
                raise ValueError(
                    f"decoder row {row} is past the {self.num_rows} rows this decoder was "
                    f"built with (one per stream slot); build it with rows={row + 1} or more")
            self._grow_rows(max(2 * self.num_rows, row + 1))
        state = DecoderState(**self._views(row), pool_row=row)
        reset_in_place(state, self.blank_id)
        self._states[row] = state
        return state

    def release(self, state: DecoderState) -> None:
        """Free ``state``'s row for the next state made there (its data stays in place).

        Raises:
            ValueError: ``state`` does not hold a row here (already released: a double free).
        """
        row = state.pool_row
        if row is None or self._states.get(row) is not state:
            raise ValueError(f"double free of decoder row {row}: the state no longer holds it")
        del self._states[row]
        for name in TENSOR_FIELDS:
            setattr(state, name, getattr(self.storage, name)[row:row])

    def detach(self, state: DecoderState) -> None:
        """Give ``state`` tensors of its own (a copy of its row) and free the row."""
        row = self._row_of(state)
        assert row is not None, "detach of a state this storage does not hold"
        for name in TENSOR_FIELDS:
            setattr(state, name, getattr(state, name).clone())
        state.pool_row = None
        del self._states[row]

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
            if self.fixed:
                raise RuntimeError(
                    f"a decoder state of {values['tokens'].shape[-1]} token columns does not "
                    f"fit this decoder's {self.capacity} (max_segment_frames)")
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

        Raises:
            RuntimeError: a ``fixed`` storage whose buffers cannot hold them.
        """
        if max(s.max_len_bound for s in states) + num_new_frames + 1 <= self.capacity:
            return
        lengths = self.storage.prefix_len.index_select(0, index).amax(dim=1).tolist()
        for state, length in zip(states, lengths, strict=True):
            state.max_len_bound = int(length)
        needed = max(lengths) + num_new_frames + 1
        if needed > self.capacity:
            if self.fixed:
                raise RuntimeError(
                    f"a decoder state would reach {needed - 1} tokens ({max(lengths)} held and "
                    f"{num_new_frames} new frames), past the {self.capacity - 1} this decoder "
                    f"was built for (max_segment_frames): reset the stream before, or build "
                    f"the decoder with max_segment_frames >= {needed - 1}")
            self._grow_capacity(max(needed, 2 * self.capacity))

    def gather(self, index: torch.Tensor, max_len_bound: int,
               width: int | None = None) -> DecoderState:
        """A B-row working state holding copies of the rows ``index`` (B,).

        Args:
            width: token columns to copy (the prefixes' bound, the chunk's frames and a
                scratch column are all a search touches); None: all ``capacity``.
        """
        cols = self.capacity if width is None else min(width, self.capacity)
        parts: dict[str, Any] = {}
        for name in TENSOR_FIELDS:
            field_ = getattr(self.storage, name)
            if name in TOKEN_FIELDS:
                field_ = field_[..., :cols]
            parts[name] = field_.index_select(0, index)
        return DecoderState(**parts, max_len_bound=max_len_bound)

    def scatter(self, index: torch.Tensor, work: DecoderState) -> None:
        """Write a working state's rows back to rows ``index`` (in place: views stay valid);
        its token buffers into their first ``work.capacity`` columns."""
        for name in TENSOR_FIELDS:
            field_ = getattr(self.storage, name)
            if name in TOKEN_FIELDS:
                field_ = field_[..., : work.capacity]
            field_.index_copy_(0, index, getattr(work, name))

    def _row_of(self, state: DecoderState) -> int | None:
        """The state's row, or None for a state that owns its tensors.

        Raises:
            ValueError: a released state (its row is no longer its own).
        """
        row = state.pool_row
        if row is None:
            return None
        if self._states.get(row) is not state:
            raise ValueError(f"the decoder state of row {row} was freed")
        return row

    def _views(self, row: int) -> dict[str, Any]:
        return {n: getattr(self.storage, n)[row : row + 1] for n in TENSOR_FIELDS}

    def _repoint(self) -> None:
        for row, state in self._states.items():
            for name, view in self._views(row).items():
                setattr(state, name, view)

    def _grow_rows(self, num_rows: int) -> None:
        old = self.storage
        grown = new_state(num_rows, self.beam_size, old.capacity, self.blank_id, self.device)
        for name in TENSOR_FIELDS:
            getattr(grown, name)[: old.batch_size].copy_(getattr(old, name))
        self.storage = grown
        self._index_cache = None
        self._repoint()

    def _grow_capacity(self, capacity: int) -> None:
        self.storage.tokens = pad_capacity(self.storage.tokens, capacity)
        self.storage.token_frames = pad_capacity(self.storage.token_frames, capacity)
        self._repoint()
