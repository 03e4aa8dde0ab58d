"""Autoregressive-decoder K/V: FP8 storage helpers, the paged decoder K/V manager and its view.

The decoder K/V is the second growing cache kind (seed §10): it grows one token per step and
never evicts, on its own ``BlockPool``. ``DecoderKVCacheManager`` hands each request a *row*
(two block-table rows: the self-attention K/V that grows, and the cross-attention K/V, a
fixed-extent region of ``cross_len`` frames written once by ``build_cross_kv``). Pages are
allocated as a row crosses a block boundary and all of a row's pages are freed when it
finishes; ``can_admit`` reserves each row's declared ceiling so a request never runs out of
pages half-answered. ``PagedDecoderKv`` is the per-step view a decoder forward reads through.

FP8 (``kv_cache="fp8_e4m3"``): data is ``float8_e4m3fn`` with one fp32 power-of-two scale per
(token, kv head), the least power of two that puts the vector's amax inside +-448.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from oasr.cache.block_pool import BlockPool
from oasr.cache.host_mirror import HostMirroredTable
from oasr.cache.state import StreamSlotPool
from oasr.fmha import (
    PagedKVCache,
    dense_attention,
    gather_length,
    key_padding_mask,
    write_chunk_kv,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
FP32_MIN_EXPONENT = -126  # keeps a scale of near-zero vectors a normal (non-zero) float32
KV_CACHE_FORMATS = (None, "fp8_e4m3")
KV_STORAGES = ("auto", "paged", "dense")


def check_kv_cache_format(kv_cache: str | None) -> None:
    """Raise ``ValueError`` for a K/V format oasr cannot store."""
    if kv_cache not in KV_CACHE_FORMATS:
        raise ValueError(
            f"unknown decoder kv_cache format {kv_cache!r}: use None (the served dtype) or "
            "'fp8_e4m3'"
        )


def resolve_kv_storage(kv_storage: str, beam_size: int) -> str:
    """``auto`` -> ``paged`` for greedy decoding, ``dense`` for beam search.

    Beam search expands rows by repeated-index selects, which would alias two rows onto one
    page of the paged pool; it runs on dense per-group buffers instead.
    """
    if kv_storage not in KV_STORAGES:
        raise ValueError(f"kv_storage must be one of {KV_STORAGES}, got {kv_storage!r}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if kv_storage == "paged" and beam_size > 1:
        raise ValueError(
            f"kv_storage='paged' cannot run beam search (beam_size={beam_size}): a beam expand "
            "would alias rows onto shared pages; use kv_storage='dense' or 'auto'"
        )
    if kv_storage == "auto":
        return "paged" if beam_size == 1 else "dense"
    return kv_storage


@dataclass
class QuantizedKv:
    """FP8 vectors with their scales: ``data`` (..., D) float8_e4m3fn, ``scales`` (...) fp32.

    The value of a vector is ``data.float() * scales[..., None]``.
    """

    data: torch.Tensor
    scales: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(..., D) in ``dtype``."""
        return (self.data.float() * self.scales.unsqueeze(-1)).to(dtype)


def fp8_scales(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (...) fp32: the least power of two s with amax(|x|) / s <= 448 (1 for zeros)."""
    amax = x.detach().abs().amax(dim=-1).float()
    exponent = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(min=FP32_MIN_EXPONENT)
    scales = torch.exp2(exponent)
    return torch.where(amax > 0, scales, torch.ones_like(scales))


def quantize_fp8(x: torch.Tensor) -> QuantizedKv:
    """(..., D) float -> QuantizedKv with per-vector power-of-two scales (batch-invariant)."""
    scales = fp8_scales(x)
    data = (x.float() / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedKv(data, scales)


def quantize_kv_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: QuantizedKv,
    v_store: QuantizedKv,
    slots: torch.Tensor,
) -> None:
    """Quantize one layer's new K and V and scatter them to flat slots of the stores.

    Args:
        k, v: (N, H, D) new vectors, one per flat slot.
        k_store, v_store: data (num_slots, H, D) fp8 and scales (num_slots, H) fp32; views of
            the persistent storage (a pool layer flattened over blocks x page).
        slots: (N,) int64 destination slots.
    """
    for new, store in ((k, k_store), (v, v_store)):
        quantized = quantize_fp8(new)
        store.data.view(torch.uint8).index_copy_(0, slots, quantized.data.view(torch.uint8))
        store.scales.index_copy_(0, slots, quantized.scales)


def causal_bias(num_cached: torch.Tensor, num_new: int, length: int) -> torch.Tensor | None:
    """(B, 1, T, L) additive mask letting new token t of row b see keys j <= num_cached[b] + t.

    None when ``num_new`` is 1: a lone new token sees every stored key of its row, which the
    key padding mask already says.
    """
    if num_new == 1:
        return None
    steps = torch.arange(num_new, device=num_cached.device)
    query_pos = num_cached.long().unsqueeze(1) + steps  # (B, T)
    keys = torch.arange(length, device=num_cached.device)
    hidden = keys[None, None, :] > query_pos[:, :, None]  # (B, T, L)
    bias = torch.zeros(hidden.shape, dtype=torch.float32, device=num_cached.device)
    return bias.masked_fill(hidden, float("-inf")).unsqueeze(1)


@dataclass(frozen=True)
class AdmitDecision:
    """``can_admit``'s answer: ``ok`` and, when refused, a reason with the numbers."""

    ok: bool
    reason: str = ""


@dataclass
class _DecoderRow:
    slot: int
    max_tokens: int  # declared self-attention ceiling (prompt plus generated tokens)
    reserved: int  # blocks of the ceiling not yet taken from the pool
    self_blocks: list[int] = field(default_factory=list)
    cross_blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    cross_len: int = 0


class DecoderKVCacheManager:
    """Paged decoder K/V rows on their own ``BlockPool``: grow one page at a time, never evict,
    free whole rows.

    A row owns two block-table rows at its slot: ``self_table`` (its self-attention tokens,
    growing) and ``cross_table`` (its encoder frames, a fixed extent of ``cross_len`` frames
    written once). Invariant: for every live row, pages held + ``reserved`` == the blocks of
    its declared ceiling (``blocks_for(max_tokens)``), and ``num_reserved_blocks`` (the sum of
    the rows' ``reserved``) never exceeds the pool's free blocks, so a page a row needs is
    always there. Tables live on the pool's device behind host mirrors (one copy per flush).

    Args:
        pool: the decoder's own pool; its config gives layers, kv heads, head dim, page size
            (``block_size_frames``), row count (``max_batch_size``), the self table's width
            (``max_blocks_per_seq``) and the storage dtype (``float8_e4m3fn`` for fp8).
        cross_len: encoder frames of the cross-attention region (Whisper: 1500).
        kv_cache: None (the pool's dtype as served) or ``"fp8_e4m3"`` (pool must be fp8).
    """

    def __init__(self, pool: BlockPool, cross_len: int, kv_cache: str | None = None) -> None:
        check_kv_cache_format(kv_cache)
        cfg = pool.config
        if (kv_cache == "fp8_e4m3") != (cfg.dtype == FP8_DTYPE):
            raise ValueError(
                f"decoder kv_cache={kv_cache!r} needs a pool of "
                f"{'float8_e4m3fn' if kv_cache else 'a served dtype'}, got {cfg.dtype}: the "
                "pool's format and the decoder's must agree"
            )
        if cross_len < 0:
            raise ValueError(f"cross_len must be >= 0, got {cross_len}")
        self.pool = pool
        self.block_size = cfg.block_size_frames
        self.cross_len = cross_len
        self.kv_cache = kv_cache
        self.max_tokens_per_row = cfg.max_blocks_per_seq * self.block_size
        self.cross_blocks_per_row = math.ceil(cross_len / self.block_size)
        self._slots = StreamSlotPool(cfg.max_batch_size)
        rows = cfg.max_batch_size
        self.self_table = HostMirroredTable((rows, cfg.max_blocks_per_seq), cfg.device)
        self.self_lens = HostMirroredTable((rows,), cfg.device)
        self.cross_table = HostMirroredTable((rows, max(self.cross_blocks_per_row, 1)), cfg.device)
        self.cross_lens = HostMirroredTable((rows,), cfg.device)
        self._rows: dict[int, _DecoderRow] = {}
        self.num_reserved_blocks = 0
        self.k_scales: torch.Tensor | None = None
        self.v_scales: torch.Tensor | None = None
        if kv_cache == "fp8_e4m3":
            shape = pool.k_pool.shape[:-1]  # (layers, physical blocks, page, H_kv)
            self.k_scales = torch.zeros(shape, dtype=torch.float32, device=cfg.device)
            self.v_scales = torch.zeros(shape, dtype=torch.float32, device=cfg.device)

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def blocks_for(self, max_tokens: int) -> int:
        """Pages one row of ceiling ``max_tokens`` may ever hold: self plus cross region."""
        return math.ceil(max_tokens / self.block_size) + self.cross_blocks_per_row

    def can_admit(self, max_tokens: Sequence[int]) -> AdmitDecision:
        """Whether rows with these declared ceilings fit, counting earlier rows' reservations."""
        for tokens in max_tokens:
            if not 1 <= tokens <= self.max_tokens_per_row:
                return AdmitDecision(False, f"row ceiling {tokens} tokens outside 1.."
                                     f"{self.max_tokens_per_row} (the block table's width)")
        if len(max_tokens) > self._slots.num_free_slots:
            return AdmitDecision(False, f"{len(max_tokens)} rows asked, "
                                 f"{self._slots.num_free_slots} row slots free")
        need = sum(self.blocks_for(t) for t in max_tokens)
        available = self.pool.num_free_blocks - self.num_reserved_blocks
        if need > available:
            return AdmitDecision(False, f"{len(max_tokens)} rows need {need} blocks, "
                                 f"{available} unreserved of {self.pool.num_blocks}")
        return AdmitDecision(True)

    def allocate_row(self, row_id: int, max_tokens: int) -> int:
        """Admit one row, reserving its whole ceiling; returns its slot.

        Raises:
            ValueError: ``row_id`` already live.
            RuntimeError: ``can_admit`` refuses (the message says why).
        """
        if row_id in self._rows:
            raise ValueError(f"decoder row {row_id} is already allocated")
        decision = self.can_admit([max_tokens])
        if not decision.ok:
            raise RuntimeError(f"cannot admit decoder row {row_id}: {decision.reason}")
        reserved = self.blocks_for(max_tokens)
        self._rows[row_id] = _DecoderRow(self._slots.allocate(), max_tokens, reserved)
        self.num_reserved_blocks += reserved
        return self._rows[row_id].slot

    def _take(self, row: _DecoderRow, n: int) -> list[int]:
        assert n <= row.reserved, f"row needs {n} pages beyond its reservation ({row.reserved})"
        ids = self.pool.allocate(n)
        row.reserved -= n
        self.num_reserved_blocks -= n
        return ids

    def _row(self, row_id: int) -> _DecoderRow:
        try:
            return self._rows[row_id]
        except KeyError:
            raise KeyError(f"unknown decoder row {row_id} ({len(self._rows)} live)") from None

    def build_cross_kv(self, row_ids: Sequence[int], cross_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store each row's encoder K/V as its fixed-extent cross region (one write per layer).

        Args:
            row_ids: B live rows without a cross region yet.
            cross_kv: per layer (K, V), each (B, S, H_kv, D), S <= ``cross_len``.
        """
        batch, frames = cross_kv[0][0].shape[:2]
        if batch != len(row_ids):
            raise ValueError(f"cross K/V has {batch} rows for {len(row_ids)} decoder rows")
        if frames > self.cross_len:
            raise ValueError(f"cross K/V has {frames} frames, rows reserve {self.cross_len}")
        needed = math.ceil(frames / self.block_size)
        for row_id in row_ids:
            row = self._row(row_id)
            if row.cross_blocks:
                raise ValueError(f"decoder row {row_id} already has its cross K/V")
            row.cross_blocks = self._take(row, needed)
            row.cross_len = frames
            self.cross_table.host[row.slot, :needed] = row.cross_blocks
            self.cross_lens.host[row.slot] = frames
            self.cross_table.mark_dirty(row.slot)
            self.cross_lens.mark_dirty(row.slot)
        view = self.view(row_ids)
        for layer, (k, v) in enumerate(cross_kv):
            view.store(layer, view.cross_table, torch.zeros_like(view.cross_lens), k, v)

    def prepare(self, row_ids: Sequence[int], num_tokens: int) -> None:
        """Give every row pages for its next ``num_tokens`` tokens (from its reservation)."""
        for row_id in row_ids:
            row = self._row(row_id)
            total = row.num_tokens + num_tokens
            if total > row.max_tokens:
                raise ValueError(f"decoder row {row_id}: {row.num_tokens} tokens + {num_tokens}"
                                 f" new > its declared ceiling {row.max_tokens}")
            missing = math.ceil(total / self.block_size) - len(row.self_blocks)
            if missing > 0:
                start = len(row.self_blocks)
                row.self_blocks += self._take(row, missing)
                self.self_table.host[row.slot, start : start + missing] = row.self_blocks[start:]
                self.self_table.mark_dirty(row.slot)

    def commit(self, row_ids: Sequence[int], num_tokens: int) -> None:
        """Record that each row now holds ``num_tokens`` more tokens."""
        for row_id in row_ids:
            row = self._row(row_id)
            row.num_tokens += num_tokens
            self.self_lens.host[row.slot] = row.num_tokens
            self.self_lens.mark_dirty(row.slot)

    def free_row(self, row_id: int) -> None:
        """Free every page of a finished row and release the rest of its reservation."""
        row = self._rows.pop(row_id, None)
        if row is None:
            raise KeyError(f"unknown decoder row {row_id} ({len(self._rows)} live)")
        self.pool.free(row.self_blocks + row.cross_blocks)
        self.num_reserved_blocks -= row.reserved
        for table in (self.self_table, self.cross_table, self.self_lens, self.cross_lens):
            table.host[row.slot] = 0
            table.mark_dirty(row.slot)
        self._slots.free(row.slot)

    def has_row(self, row_id: int) -> bool:
        return row_id in self._rows

    def num_tokens(self, row_id: int) -> int:
        return self._row(row_id).num_tokens

    def row_blocks(self, row_id: int) -> tuple[list[int], list[int]]:
        """(self-attention pages, cross pages) of a row, in logical order."""
        row = self._row(row_id)
        return list(row.self_blocks), list(row.cross_blocks)

    def view(self, row_ids: Sequence[int], reuse_cross: bool = True) -> PagedDecoderKv:
        """A view of these rows, in this order (distinct rows only); see ``PagedDecoderKv``."""
        return PagedDecoderKv(self, list(row_ids), reuse_cross)


def _flat_slots(table: torch.Tensor, lens: torch.Tensor, num_new: int, block_size: int) -> torch.Tensor:
    """(B * T,) flat pool slots of positions lens[b] + t through a (B, W) block table."""
    positions = lens.long().unsqueeze(1) + torch.arange(num_new, device=table.device)  # (B, T)
    physical = table.long().gather(1, positions // block_size)  # (B, T)
    return (physical * block_size + positions % block_size).reshape(-1)


def _attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``dense_attention`` over head-major keys, with (head, row) pairs as its batch so every
    matmul operand is contiguous (a token-major (B, L, H, D) gather costs a copy per matmul).

    Args:
        q: (B, T, H, D); k, v: (H, B, L, D); valid: (B, L); bias: (B, 1 or H, T, L) or None.
    Returns:
        (B, T, H, D).
    """
    heads, batch, length, dim = k.shape
    tokens = q.size(1)
    q_flat = q.permute(2, 0, 1, 3).reshape(heads * batch, tokens, 1, dim)
    k_flat = k.reshape(heads * batch, length, 1, dim)
    v_flat = v.reshape(heads * batch, length, 1, dim)
    if bias is not None:
        bias = bias.expand(batch, heads, tokens, length).transpose(0, 1)
        bias = bias.reshape(heads * batch, 1, tokens, length)
    out = dense_attention(q_flat, k_flat, v_flat, valid.repeat(heads, 1), bias)  # (HB, T, 1, D)
    return out.reshape(heads, batch, tokens, dim).permute(1, 2, 0, 3)


class PagedDecoderKv:
    """A ``DecoderKvStore`` over B distinct rows of a ``DecoderKVCacheManager``.

    Holds the rows' block-table rows and lengths gathered from the manager's slot-addressed
    tables (self: growing, cross: fixed). Rows may hold different numbers of tokens. Each row's
    pages are its own, so ``select`` may reorder rows but refuses to repeat one: two batch rows
    on one page would overwrite each other's next token. Beam search uses ``DecoderKv``.

    With ``reuse_cross`` (the default) the view keeps each layer's gathered cross K/V after its
    first read: the cross region never changes, so later steps of the same rows skip the
    per-step page gather (on CPU that gather costs more than the whole dense step). It costs
    the dense cross K/V's memory while the view lives; pass False to read pages every step
    (e.g. under a captured graph, whose reads must go to the pool).
    """

    def __init__(self, manager: DecoderKVCacheManager, row_ids: list[int],
                 reuse_cross: bool = True) -> None:
        if len(set(row_ids)) != len(row_ids):
            raise ValueError(f"decoder rows {row_ids} repeat a row: pages cannot be aliased")
        self.manager = manager
        self.row_ids = row_ids
        self.fp8 = manager.kv_cache == "fp8_e4m3"
        self.reuse_cross = reuse_cross
        self._cross_reads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        device = manager.pool.config.device
        slots = [manager._row(r).slot for r in row_ids]
        self._slots = torch.tensor(slots, dtype=torch.long, device=device)
        self._refresh()

    @property
    def batch_size(self) -> int:
        return len(self.row_ids)

    def _refresh(self) -> None:
        m = self.manager
        for table in (m.self_table, m.self_lens, m.cross_table, m.cross_lens):
            table.flush()
        self.self_table = m.self_table.device.index_select(0, self._slots)  # (B, W)
        self.self_lens = m.self_lens.device.index_select(0, self._slots)  # (B,)
        self.cross_table = m.cross_table.device.index_select(0, self._slots)  # (B, Wc)
        self.cross_lens = m.cross_lens.device.index_select(0, self._slots)  # (B,)
        rows = [m._row(r) for r in self.row_ids]
        self.host_len = max((r.num_tokens for r in rows), default=0)
        self.host_cross = max((r.cross_len for r in rows), default=0)

    def _cache(self, layer: int, table: torch.Tensor, lens: torch.Tensor, host: int) -> PagedKVCache:
        k_pool, v_pool = self.manager.pool.get_kv_view(layer)
        return PagedKVCache(k_pool, v_pool, table, lens, self.manager.block_size, host)

    def store(self, layer: int, table: torch.Tensor, lens: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write K, V (B, T, H, D) at positions lens[b] + t of each row's pages (``table``)."""
        if not self.fp8:
            write_chunk_kv(self._cache(layer, table, lens, 0), k, v)
            return
        m = self.manager
        assert m.k_scales is not None and m.v_scales is not None
        heads, dim = k.shape[2:]
        k_pool, v_pool = m.pool.get_kv_view(layer)
        k_store = QuantizedKv(k_pool.view(-1, heads, dim), m.k_scales[layer].view(-1, heads))
        v_store = QuantizedKv(v_pool.view(-1, heads, dim), m.v_scales[layer].view(-1, heads))
        slots = _flat_slots(table, lens, k.size(1), m.block_size)  # (B * T,)
        quantize_kv_store(k.reshape(-1, heads, dim), v.reshape(-1, heads, dim), k_store, v_store,
                          slots)

    def _gather_heads(self, layer: int, table: torch.Tensor, length: int,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' first ``length`` positions (whole pages), K and V each (H, B, length, D) in
        ``dtype``: one head-major gather per tensor, fp8 pages dequantized after the gather
        (only the pages read, never the pool)."""
        m = self.manager
        batch = table.size(0)
        ids = table[:, : length // m.block_size].reshape(-1).long()  # (B * nb,)
        k_pool, v_pool = m.pool.get_kv_view(layer)  # (P, page, H, D)
        heads, dim = k_pool.shape[2:]
        out = []
        for pool, pool_scales in zip((k_pool, v_pool), (m.k_scales, m.v_scales), strict=True):
            pages = pool.index_select(0, ids)  # (B * nb, page, H, D)
            if pool_scales is None:
                tiles = pages.to(dtype)
            else:
                tiles = QuantizedKv(pages, pool_scales[layer].index_select(0, ids)).dequantize(dtype)
            tiles = tiles.view(batch, length, heads, dim).permute(2, 0, 1, 3)  # (H, B, L, D)
            out.append(tiles.contiguous())
        return out[0], out[1]

    def begin(self, num_tokens: int) -> torch.Tensor:
        """Allocate pages for the next ``num_tokens`` tokens; (B, T) int64 positions."""
        self.manager.prepare(self.row_ids, num_tokens)
        self._refresh()
        steps = torch.arange(num_tokens, device=self.self_lens.device)
        return self.self_lens.long().unsqueeze(1) + steps

    def attend_self(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store K/V (B, T, H, D), then causal attention of q (B, T, H, D) -> (B, T, H, D)."""
        num_new = q.size(1)
        self.store(layer, self.self_table, self.self_lens, k, v)
        if self.fp8 and self.host_len == 0:  # a prefill attends its own K/V in the served dtype
            fresh = torch.ones(q.size(0), num_new, dtype=torch.bool, device=q.device)
            return dense_attention(q, k, v, fresh, causal_bias(self.self_lens, num_new, num_new))
        cache = self._cache(layer, self.self_table, self.self_lens, self.host_len)
        length = gather_length(cache, num_new)
        keys, values = self._gather_heads(layer, self.self_table, length, q.dtype)
        valid = key_padding_mask(self.self_lens + num_new, length)
        return _attend_heads(q, keys, values, valid, causal_bias(self.self_lens, num_new, length))

    def attend_cross(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D) over each row's stored encoder frames -> (B, T, H, D)."""
        cache = self._cache(layer, self.cross_table, self.cross_lens, self.host_cross)
        length = gather_length(cache, 0)
        if layer in self._cross_reads:
            keys, values = self._cross_reads[layer]
        else:
            keys, values = self._gather_heads(layer, self.cross_table, length, q.dtype)
            if self.reuse_cross:
                self._cross_reads[layer] = (keys, values)
        return _attend_heads(q, keys, values, key_padding_mask(self.cross_lens, length))

    def advance(self, num_tokens: int) -> None:
        self.manager.commit(self.row_ids, num_tokens)
        self.self_lens = self.self_lens + num_tokens
        self.host_len += num_tokens

    def select(self, index: Sequence[int]) -> None:
        """Keep batch rows ``index`` in that order. Refuses a repeated index (page aliasing).

        Raises:
            ValueError: an index repeats or is out of range.
        """
        picked = list(index)
        if len(set(picked)) != len(picked):
            raise ValueError(
                f"PagedDecoderKv.select({picked}) repeats a row: two batch rows would share one "
                "row's pages; run beam search on dense per-group buffers (DecoderKv)"
            )
        if any(not 0 <= i < self.batch_size for i in picked):
            raise ValueError(f"select index {picked} out of range for {self.batch_size} rows")
        self.row_ids = [self.row_ids[i] for i in picked]
        self._slots = self._slots[torch.tensor(picked, dtype=torch.long, device=self._slots.device)]
        self._cross_reads.clear()
        self._refresh()

    def merge(self, other: PagedDecoderKv) -> PagedDecoderKv:
        """One view over this view's rows then ``other``'s (e.g. running rows plus rows just
        prefilled); the rows' self and cross regions come along. Refuses shared rows."""
        if other.manager is not self.manager:
            raise ValueError("cannot merge views of different decoder K/V managers")
        return PagedDecoderKv(self.manager, self.row_ids + other.row_ids, self.reuse_cross)
