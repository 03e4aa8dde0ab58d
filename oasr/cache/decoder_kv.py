"""Autoregressive-decoder K/V: the paged decoder K/V manager and the view a decoder reads.

The decoder K/V is the second growing cache kind (the first is the encoder's attention K/V): it grows one token per step and
never evicts, on its own ``BlockPool``. ``DecoderKVCacheManager`` hands each request a *row*
(two block-table rows: the self-attention K/V that grows, and the cross-attention K/V, a
fixed-extent region of ``cross_len`` frames written once by ``build_cross_kv``). Pages are
allocated as a row crosses a block boundary and all of a row's pages are freed when it
finishes; ``can_admit`` reserves each row's declared ceiling so a request never runs out of
pages half-answered. ``PagedDecoderKv`` is the per-step view a decoder forward reads through;
it holds the rows' tables, and its attention calls ``oasr.fmha.decoder_attention`` (the FP8
format, ``kv_cache="fp8_e4m3"``, is ``oasr.fmha.fp8``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from oasr.cache.block_pool import BlockPool
from oasr.cache.host_mirror import HostMirroredTable
from oasr.cache.slots import StreamSlotPool
from oasr.fmha import PagedKVCache, gather_length
from oasr.fmha.decoder_attention import (
    Fp8Scales,
    attend_head_major,
    attend_with_shared_tail,
    decoder_cross_attention,
    decoder_self_attention,
    gather_pages_head_major,
    write_decoder_kv,
)
from oasr.fmha.fp8 import FP8_DTYPE, check_kv_cache_format

KV_STORAGES = ("auto", "paged", "dense")


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
        # per layer (K, V), each (H_kv, S, D): frames every row's cross region continues with
        # after its own (`set_shared_tail`); None: a row's cross region is its own frames only
        self.shared_tail: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        # the tail from one frame on, copied contiguous (`shared_tail_after`): (frame, per layer)
        self._tail_after: tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.k_scales: torch.Tensor | None = None
        self.v_scales: torch.Tensor | None = None
        if kv_cache == "fp8_e4m3":
            shape = (cfg.num_layers, pool.num_physical_blocks, *pool.block_shape[:-1])
            # (layers, physical blocks, page, H_kv): one scale per stored frame and head
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

    def set_shared_tail(self, tail_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Frames that every row's cross region continues with, after its own: row b's
        encoder frames are its own ``cross_len`` (as `build_cross_kv` stored them), then the
        tail's frames from index ``cross_len`` on (without a tail a row attends to its own
        frames only). Whisper's case: a segment encoded on part of the window has the silent
        window's frames after its own, the same for every row, so the pages hold each row's
        own frames and a batch's attention reads the tail once for all its rows
        (`PagedDecoderKv.attend_cross`).

        Args:
            tail_kv: per layer (K, V), each (H_kv, ``cross_len``, D), in the dtype the
                decoder attends in.
        """
        cfg = self.pool.config
        want = (cfg.n_kv_head, self.cross_len, cfg.head_dim)
        if len(tail_kv) != cfg.num_layers or any(
                tuple(t.shape) != want for pair in tail_kv for t in pair):
            shapes = [tuple(t.shape) for pair in tail_kv for t in pair]
            raise ValueError(f"a shared tail needs {cfg.num_layers} layers of K, V each {want}, "
                             f"got {shapes}")
        self.shared_tail = [(k.contiguous(), v.contiguous()) for k, v in tail_kv]
        self._tail_after = None

    def shared_tail_after(self, frame: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the shared tail's K, V from ``frame`` on, each a contiguous
        (H_kv, ``cross_len`` - ``frame``, D) copy, kept until another frame is asked for (a
        greedy batch asks for its longest row's own frames at every step while its rows stay).

        The matmul path reads such a copy as it is, where it copied a slice of the whole tail
        at every call: 8 rows' keys over 1,148 tail frames 0.08 against 0.40 ms a layer (AMD
        EPYC with AVX512-BF16, one thread, 2026-12-07), about a tenth of a greedy step.

        Raises:
            ValueError: the manager has no shared tail (`set_shared_tail`).
        """
        if self.shared_tail is None:
            raise ValueError("shared_tail_after needs a shared tail (set_shared_tail)")
        if self._tail_after is None or self._tail_after[0] != frame:
            self._tail_after = (frame, [(k[:, frame:].contiguous(), v[:, frame:].contiguous())
                                        for k, v in self.shared_tail])
        return self._tail_after[1]

    def build_cross_kv(self, row_ids: Sequence[int], cross_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store each row's encoder K/V as its fixed-extent cross region (one write per layer):
        the S frames it attends to, followed by the shared tail's where the manager has one
        (`set_shared_tail`).

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

    def truncate(self, row_id: int, num_tokens: int) -> None:
        """Keep a row's first ``num_tokens`` tokens (a draft fed past what the decode took);
        its pages stay its own, the later tokens are written over them.

        Raises:
            ValueError: ``num_tokens`` is negative or more than the row holds.
        """
        row = self._row(row_id)
        if not 0 <= num_tokens <= row.num_tokens:
            raise ValueError(f"decoder row {row_id}: cannot truncate {row.num_tokens} tokens "
                             f"to {num_tokens}")
        row.num_tokens = num_tokens
        self.self_lens.host[row.slot] = num_tokens
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

    def _cross_cache(self, layer: int) -> tuple[PagedKVCache, int]:
        """This layer's cross region of the rows, and the key columns a read of it gathers
        (the longest row's pages)."""
        cache = self._cache(layer, self.cross_table, self.cross_lens, self.host_cross)
        return cache, gather_length(cache, 0)

    def _layer_scales(self, layer: int) -> Fp8Scales | None:
        """This layer's FP8 (k, v) scales, each (physical blocks, page, H_kv); None unless FP8."""
        m = self.manager
        if m.k_scales is None or m.v_scales is None:
            return None
        return m.k_scales[layer], m.v_scales[layer]

    def store(self, layer: int, table: torch.Tensor, lens: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write K, V (B, T, H, D) at positions lens[b] + t of each row's pages (``table``)."""
        write_decoder_kv(self._cache(layer, table, lens, 0), k, v, self._layer_scales(layer))

    def begin(self, num_tokens: int) -> torch.Tensor:
        """Allocate pages for the next ``num_tokens`` tokens; (B, T) int64 positions."""
        self.manager.prepare(self.row_ids, num_tokens)
        self._refresh()
        steps = torch.arange(num_tokens, device=self.self_lens.device)
        return self.self_lens.long().unsqueeze(1) + steps

    def attend_self(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store K/V (B, T, H, D), then causal attention of q (B, T, H, D) -> (B, T, H, D)."""
        cache = self._cache(layer, self.self_table, self.self_lens, self.host_len)
        return decoder_self_attention(q, k, v, cache, self._layer_scales(layer))

    def attend_cross(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D) over each row's encoder frames -> (B, T, H, D): its stored frames,
        then, where the manager has a shared tail, the tail's after them.

        With a tail the rows' pages are read up to the longest row's own frames (L), each
        shorter row's frames continued there from the tail, and the tail's frames from L on
        are attended once for all rows (`attend_with_shared_tail`): a batch of segments
        encoded on a third of Whisper's window reads a third of the bytes a step.
        """
        if layer in self._cross_reads:
            keys, values = self._cross_reads[layer]
        else:
            cache, length = self._cross_cache(layer)
            keys, values = gather_pages_head_major(cache, length, q.dtype,
                                                   self._layer_scales(layer))
            if self.manager.shared_tail is not None:
                width = self._cross_width()
                if width < length:  # the last page runs past the window
                    keys, values = keys[:, :, :width].contiguous(), values[:, :, :width].contiguous()
                self._continue_rows(layer, keys, values)
            if self.reuse_cross:
                self._cross_reads[layer] = (keys, values)
        tail = self.manager.shared_tail
        if tail is None:
            return decoder_cross_attention(q, keys, values, self.cross_lens)
        own = keys.size(2)
        if own == tail[layer][0].size(1):  # the rows hold (or were continued to) the whole window
            return attend_head_major(q, keys, values, None)
        k_tail, v_tail = self.manager.shared_tail_after(own)[layer]
        return attend_with_shared_tail(q, keys.permute(1, 2, 0, 3), values.permute(1, 2, 0, 3),
                                       k_tail, v_tail)

    def _cross_width(self) -> int:
        """Frames a read of the rows' cross regions holds: the longest row's pages, at most
        the shared tail's frames (the whole window) where the manager has a tail."""
        length = self._cross_cache(0)[1]
        tail = self.manager.shared_tail
        return length if tail is None else min(length, tail[0][0].size(1))

    def _continue_rows(self, layer: int, keys: torch.Tensor, values: torch.Tensor,
                       frames: Sequence[int] | None = None) -> None:
        """Write the shared tail's frames after each row's own in head-major (H, B, L, D) reads
        (zeros without a tail: those columns are masked then); ``frames``: each row's own
        frames (default: its ``cross_len``)."""
        tail = self.manager.shared_tail
        length = keys.size(2)
        if frames is None:
            frames = [self.manager._row(r).cross_len for r in self.row_ids]
        for b, n in enumerate(frames):
            if n < length:
                keys[:, b, n:] = 0 if tail is None else tail[layer][0][:, n:length]
                values[:, b, n:] = 0 if tail is None else tail[layer][1][:, n:length]

    def advance(self, num_tokens: int) -> None:
        self.manager.commit(self.row_ids, num_tokens)
        self.self_lens = self.self_lens + num_tokens
        self.host_len += num_tokens

    def select(self, index: Sequence[int]) -> None:
        """Keep batch rows ``index`` in that order. Refuses a repeated index (page aliasing).

        Cross K/V already gathered stays gathered: the kept rows' are selected from it (one
        copy of theirs, as long as the longest kept row needs), not read from the pages again
        (a page gather and its head-major copy cost about 2.5x as much). Rows leaving a greedy
        batch one by one as their segments end then cost no gather at all.

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
        order = torch.tensor(picked, dtype=torch.long, device=self._slots.device)
        self._slots = self._slots[order]
        self._refresh()
        if self._cross_reads:
            length = self._cross_width()
            self._cross_reads = {
                layer: (keys[:, :, :length].index_select(1, order),
                        values[:, :, :length].index_select(1, order))  # (H, B', L', D)
                for layer, (keys, values) in self._cross_reads.items()}

    @classmethod
    def joined(cls, parts: Sequence[PagedDecoderKv], row_ids: Sequence[int]) -> PagedDecoderKv:
        """A view over ``row_ids`` (in this order), each a row of one of ``parts``, that keeps
        the cross K/V the parts have gathered.

        A layer that every part giving rows has read is copied into the new view row by row
        (a row's encoder frames; the columns past them, up to the longest row's pages, are
        zero and masked), not read from the pages again. A greedy batch that takes the rows
        just prefilled, whose prefill gathered their cross K/V, then costs one copy of each
        row's instead of a page gather and a head-major copy of every row's. Other layers
        are read from the pages when first attended.

        Raises:
            ValueError: no parts, parts of different managers, or a row in none of them.
        """
        if not parts:
            raise ValueError("joined() needs at least one view")
        manager = parts[0].manager
        if any(part.manager is not manager for part in parts):
            raise ValueError("cannot join views of different decoder K/V managers")
        where: dict[int, tuple[PagedDecoderKv, int]] = {}
        for part in parts:
            for index, row_id in enumerate(part.row_ids):
                where.setdefault(row_id, (part, index))
        missing = [row_id for row_id in row_ids if row_id not in where]
        if missing:
            raise ValueError(f"decoder rows {missing} are in none of the views joined")
        view = cls(manager, list(row_ids), parts[0].reuse_cross)
        sources = [where[row_id] for row_id in row_ids]
        giving = list({id(part): part for part, _ in sources}.values())
        layers = set.intersection(*(set(part._cross_reads) for part in giving))
        if not view.reuse_cross or not layers:
            return view
        length = view._cross_width()
        frames = [manager._row(row_id).cross_len for row_id in row_ids]
        for layer in sorted(layers):
            joined = []
            for which in (0, 1):  # keys, values: each (H, B, L, D)
                first = sources[0][0]._cross_reads[layer][which]
                out = first.new_empty(first.size(0), len(sources), length, first.size(3))
                for b, ((part, index), n) in enumerate(zip(sources, frames, strict=True)):
                    out[:, b, :n] = part._cross_reads[layer][which][:, index, :n]
                joined.append(out)
            view._continue_rows(layer, joined[0], joined[1], frames)
            view._cross_reads[layer] = (joined[0], joined[1])
        return view

    def merge(self, other: PagedDecoderKv) -> PagedDecoderKv:
        """One view over this view's rows then ``other``'s (e.g. running rows plus rows just
        prefilled); the rows' self and cross regions come along, and the cross K/V both have
        gathered (`joined`). Refuses shared rows."""
        return PagedDecoderKv.joined([self, other], self.row_ids + other.row_ids)
