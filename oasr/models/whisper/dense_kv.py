"""Dense per-group decoder K/V: one capacity buffer per layer for a group of rows that advance
together (a greedy batch, or a beam group). Beam search reorders and repeats rows with
``select``, which copies the self-attention K/V, so rows never share it: a step that keeps the
row count rewrites in place only the rows whose parent is another row (about a quarter of them
in a batch of 8 segments' beams).

With ``shared_cross=True`` the cross-attention K/V is stored once per group (one row per
segment) and never copied: the rows of a group stay contiguous (beam search's children of
group g are rows g*K .. g*K+K-1), so cross-attention folds a group's rows into its query
length, (G*K, T, H, D) -> (G, K*T, H, D), against the group's (G, S, H, D) K/V. A beam of 5
then costs 5 rows of self-attention K/V (a few dozen tokens), not 5 copies of 1500 frames."""

from __future__ import annotations

import torch

from oasr.fmha import dense_attention
from oasr.fmha.decoder_attention import attend_with_shared_tail, causal_bias
from oasr.fmha.fp8 import FP8_DTYPE, QuantizedKv, check_kv_cache_format, quantize_fp8


class _LayerBuffer:
    """One layer's K or V, (B, H, cap, D): in the served dtype, or fp8 data plus (B, H, cap)
    scales. Head-major, so a read of the first L tokens is a strided view that matmul takes
    without a copy."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device,
                 fp8: bool, zeroed: bool = True) -> None:
        make = torch.zeros if zeroed else torch.empty
        self.data = make(shape, dtype=FP8_DTYPE if fp8 else dtype, device=device)
        self.scales = make(shape[:3], dtype=torch.float32, device=device) if fp8 else None

    @classmethod
    def holding(cls, x: torch.Tensor) -> _LayerBuffer:
        """A buffer over ``x`` (B, L, H, D) itself, a view of head-major (B, H, L, D) storage in
        the served dtype: nothing copied (the buffer then writes into ``x``'s storage)."""
        buffer = cls.__new__(cls)
        buffer.data = x.transpose(1, 2)
        buffer.scales = None
        return buffer

    def write(self, start: int, x: torch.Tensor) -> None:
        """x: (B, T, H, D) stored at positions start .. start + T - 1."""
        end = start + x.size(1)
        if self.scales is None:
            self.data[:, :, start:end] = x.transpose(1, 2).to(self.data.dtype)
            return
        quantized = quantize_fp8(x)  # data (B, T, H, D), scales (B, T, H)
        self.data[:, :, start:end] = quantized.data.transpose(1, 2)
        self.scales[:, :, start:end] = quantized.scales.transpose(1, 2)

    def move_rows(self, moves: list[tuple[int, int]]) -> None:
        """Row ``src`` copied to row ``dst`` for each (src, dst)."""
        for src, dst in moves:
            self.data[dst] = self.data[src]
            if self.scales is not None:
                self.scales[dst] = self.scales[src]

    def read(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        """(B, length, H, D) in ``dtype`` (dequantized when fp8); a view when not fp8."""
        if self.scales is None:
            return self.data[:, :, :length].to(dtype).transpose(1, 2)
        held = QuantizedKv(self.data[:, :, :length], self.scales[:, :, :length])
        return held.dequantize(dtype).transpose(1, 2)

    def select(self, index: torch.Tensor, length: int) -> None:
        """Keep rows ``index`` (B',); only the first ``length`` positions are copied (the
        rest of the capacity is never read before it is written): a beam step copies the
        tokens decoded so far, not the whole buffer."""
        self.data = _select_rows(self.data, index, length)
        if self.scales is not None:
            self.scales = _select_rows(self.scales, index, length)

    def replace_rows(self, rows: torch.Tensor, sources: torch.Tensor, length: int) -> None:
        """Row ``rows[i]`` becomes row ``sources[i]`` (as it was before the call), in place;
        the other rows stay. Only the first ``length`` positions are copied."""
        for buffer in (self.data, self.scales):
            if buffer is not None:
                # fp8 moved as its bytes (torch has no fp8 index_copy_ on CPU)
                raw = buffer.view(torch.uint8) if buffer.dtype == FP8_DTYPE else buffer
                held = raw[:, :, :length]
                held.index_copy_(0, rows, held.index_select(0, sources))


def _select_rows(buffer: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
    """(B', H, cap, ...) rows ``index`` of ``buffer`` (B, H, cap, ...), positions past
    ``length`` left unset."""
    out = buffer.new_empty((int(index.numel()), *buffer.shape[1:]))
    out[:, :, :length] = buffer[:, :, :length].index_select(0, index)
    return out


class DecoderKv:
    """Dense decoder K/V of B rows that share one length (``num_tokens``).

    Self-attention K/V per layer is a (B, H, capacity, D) buffer; the cross-attention K/V is
    (B, H, S, D) per layer, stored once. With ``kv_cache="fp8_e4m3"`` both are fp8 with one fp32
    scale per (row, token, head); a prefill into an empty cache attends its own K/V in the
    served dtype (they are stored quantized for later steps).

    Args:
        cross_kv: per layer (K, V), each (B, S, H, D), from ``WhisperDecoder.cross_kv`` or
            `SegmentEncoder.cross_kv`; one that is a view of head-major (B, H, S, D) storage
            in the served dtype is kept as it is, not copied (and is written in place by
            `keep_groups`: the caller hands it over).
        capacity: self-attention tokens each row may hold (prompt plus generated).
        kv_cache: None (served dtype) or ``"fp8_e4m3"``.
        shared_cross: keep the cross K/V once per group of rows (the B rows of ``cross_kv``
            are the groups; ``select`` may then widen each group to K rows, see the module
            docstring).
        shared_tail: per layer (K, V), each (1, T, H, D): frames every row attends after its
            own S frames of ``cross_kv`` (`SegmentEncoder.split_cross_kv`: the silent window's
            last frames), stored once in the served dtype and read once per step for all rows
            (`oasr.fmha.decoder_attention.attend_with_shared_tail`); None: the rows' S frames
            are all their frames.
    """

    def __init__(
        self,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        capacity: int,
        kv_cache: str | None = None,
        shared_cross: bool = False,
        shared_tail: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        check_kv_cache_format(kv_cache)
        if capacity < 1:
            raise ValueError(f"DecoderKv capacity must be >= 1, got {capacity}")
        k0 = cross_kv[0][0]
        batch, frames, heads, dim = k0.shape
        fp8 = kv_cache == "fp8_e4m3"
        self.dtype = k0.dtype
        self.capacity = capacity
        self.num_tokens = 0
        self.batch_size = batch
        self.num_groups = batch
        self.shared_cross = shared_cross
        self.cross_len = frames
        shape = (batch, heads, capacity, dim)
        self._self = [(_LayerBuffer(shape, k0.dtype, k0.device, fp8),
                       _LayerBuffer(shape, k0.dtype, k0.device, fp8)) for _ in cross_kv]
        self._cross = [(self._cross_buffer(k, fp8), self._cross_buffer(v, fp8))
                       for k, v in cross_kv]
        # (H, T, D) contiguous per layer: the matmuls read it as it is
        self._tail = None if shared_tail is None else [
            (k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous())
            for k, v in shared_tail]
        self.fp8 = fp8

    @staticmethod
    def _cross_buffer(x: torch.Tensor, fp8: bool) -> _LayerBuffer:
        """The buffer of one layer's cross K or V (B, S, H, D): ``x``'s own storage where it is
        head-major already in the served dtype (as `SegmentEncoder.cross_kv` builds a window
        completed with silence), else a copy."""
        if not fp8 and x.transpose(1, 2).is_contiguous():
            return _LayerBuffer.holding(x)
        batch, frames, heads, dim = x.shape
        buffer = _LayerBuffer((batch, heads, frames, dim), x.dtype, x.device, fp8, zeroed=False)
        buffer.write(0, x)
        return buffer

    def begin(self, num_tokens: int) -> torch.Tensor:
        """(B, T) positions of the next ``num_tokens`` tokens; refuses past the capacity."""
        if self.num_tokens + num_tokens > self.capacity:
            raise ValueError(
                f"DecoderKv full: {self.num_tokens} tokens held + {num_tokens} new > capacity "
                f"{self.capacity}"
            )
        device = self._self[0][0].data.device
        pos = torch.arange(self.num_tokens, self.num_tokens + num_tokens, device=device)
        return pos.unsqueeze(0).expand(self.batch_size, -1)

    def attend_self(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store K/V (B, T, H, D) at the next positions; causal attention of q (B, T, H, D)."""
        k_buf, v_buf = self._self[layer]
        k_buf.write(self.num_tokens, k)
        v_buf.write(self.num_tokens, v)
        num_new = q.size(1)
        if self.fp8 and self.num_tokens == 0:
            keys, values, length = k, v, num_new  # prefill attends fresh, in the served dtype
        else:
            length = self.num_tokens + num_new
            keys, values = k_buf.read(length, q.dtype), v_buf.read(length, q.dtype)
        held = torch.full((q.size(0),), length - num_new, device=q.device)
        return dense_attention(q, keys, values, None, causal_bias(held, num_new, length))

    def attend_cross(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D) over the row's S encoder frames (then the shared tail's, if any)
        -> (B, T, H, D)."""
        k_buf, v_buf = self._cross[layer]
        keys = k_buf.read(self.cross_len, q.dtype)
        values = v_buf.read(self.cross_len, q.dtype)
        if self.shared_cross:  # the groups kept (slots past them were left)
            keys, values = keys[: self.num_groups], values[: self.num_groups]
        rows, steps, heads, dim = q.shape
        groups = keys.size(0)
        q = q.reshape(groups, (rows // groups) * steps, heads, dim)  # a group's rows as queries
        if self._tail is not None:
            k_tail, v_tail = self._tail[layer]
            out = attend_with_shared_tail(q, keys, values, k_tail, v_tail)
        else:
            out = dense_attention(q, keys, values, None)
        return out.reshape(rows, steps, heads, dim)

    def advance(self, num_tokens: int) -> None:
        self.num_tokens += num_tokens

    def keep_groups(self, groups: list[int]) -> list[int]:
        """Keep only the groups ``groups`` (indices, increasing); their new order, as indices
        of the old groups: the next `select` picks their rows in it (K per group).

        With ``shared_cross`` the cross K/V stays in place: a kept group past the new number
        of groups moves into a slot a leaving group freed (one group's copy each, not the
        whole store's), so the order is the old one with those moved in. Without it the order
        is ``groups``' (`select` copies each kept row's cross K/V anyway).
        """
        if not self.shared_cross:
            return list(groups)
        count = len(groups)
        kept = set(groups)
        holes = [slot for slot in range(count) if slot not in kept]
        movers = [g for g in groups if g >= count]
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        moves = list(zip(movers, holes, strict=True))
        for k_buf, v_buf in self._cross:
            k_buf.move_rows(moves)
            v_buf.move_rows(moves)
        self.num_groups = count
        return order

    def select(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (B',) int64 in that order; repeats copy (beam expansion).

        Raises:
            ValueError: with ``shared_cross``, B' is not a multiple of the groups (each group
                must keep the same number of rows, in group order).
        """
        rows = int(index.numel())
        if self.shared_cross and rows % self.num_groups:
            raise ValueError(f"DecoderKv.select: {rows} rows for {self.num_groups} groups; a "
                             "shared cross K/V needs the same number of rows per group")
        if rows == self.batch_size:  # a beam step: most rows keep their own tokens
            moved = (index != torch.arange(rows, device=index.device)).nonzero().flatten()
            sources = index.index_select(0, moved)
            for k_buf, v_buf in self._self:
                k_buf.replace_rows(moved, sources, self.num_tokens)
                v_buf.replace_rows(moved, sources, self.num_tokens)
        else:
            for k_buf, v_buf in self._self:
                k_buf.select(index, self.num_tokens)
                v_buf.select(index, self.num_tokens)
        for k_buf, v_buf in () if self.shared_cross else self._cross:
            k_buf.select(index, self.cross_len)
            v_buf.select(index, self.cross_len)
        self.batch_size = rows
