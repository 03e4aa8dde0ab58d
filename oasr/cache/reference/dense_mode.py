"""Dense mode: the specification's reference API for a WeNet-style ``att_cache``.

``AttentionCacheManager`` inherits ``commit`` and ``get_stacked_cache`` from
``DenseModeMixin``. Only tests and the specification's examples (§7.2, WeNet's
``forward_chunk``) use them; the engine runs paged mode, whose forward reads the pool through
block tables and never builds a dense copy.

The dense layout is (num_layers, n_kv_head, T, 2 * head_dim) with K in ``[..., :head_dim]``
and V in ``[..., head_dim:]``; the pool layout is (num_layers, blocks, block_size, heads, dim).
Frame p of a stream's row lives in ``block_ids[p // block_size]`` at slot ``p % block_size``;
its history is row frames ``start .. start + held - 1`` (``start`` > 0 once frames of the first
block were evicted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from oasr.cache.block_pool import BlockPool
from oasr.cache.stream_kv import StreamKVState
from oasr.cache.types import CacheConfig


def write_dense_frames(
    pool: BlockPool, block_ids: Sequence[int], start: int, kv: torch.Tensor
) -> None:
    """Write packed K|V frames into the stream's blocks at frames ``start .. start + T - 1``.

    Args:
        block_ids: the stream's logical -> physical block ids; must cover the frames.
        start: frame position of ``kv``'s first frame in the stream's history.
        kv: (num_layers, n_kv_head, T, 2 * head_dim).
    """
    d = kv.size(-1) // 2
    k = kv[..., :d].permute(0, 2, 1, 3)  # (L, T, H, D)
    v = kv[..., d:].permute(0, 2, 1, 3)  # (L, T, H, D)
    bs = pool.config.block_size_frames
    t, total = 0, kv.size(2)
    while t < total:
        pos = start + t
        block, offset = block_ids[pos // bs], pos % bs
        n = min(bs - offset, total - t)
        for layer in range(pool.config.num_layers):
            kb, vb = pool.get_kv_block_view(layer, block)  # (block_size, H, D) each
            kb[offset : offset + n].copy_(k[layer, t : t + n])  # (n, H, D)
            vb[offset : offset + n].copy_(v[layer, t : t + n])
        t += n


def gather_dense(pool: BlockPool, block_ids: Sequence[int], num_frames: int,
                 start: int = 0) -> torch.Tensor:
    """Row frames ``start .. start + num_frames - 1`` of the stream (its history) as
    (num_layers, n_kv_head, T, 2 * head_dim).

    A new contiguous tensor; (L, H, 0, 2D) when ``num_frames`` is 0.
    """
    cfg = pool.config
    if num_frames == 0 or not block_ids:
        shape = (cfg.num_layers, cfg.n_kv_head, 0, cfg.kv_last_dim)
        return torch.zeros(shape, dtype=cfg.dtype, device=cfg.device)
    layers = []
    for layer in range(cfg.num_layers):
        views = [pool.get_kv_block_view(layer, b) for b in block_ids]  # (block_size, H, D) pairs
        k = torch.cat([kb for kb, _ in views])[start : start + num_frames]  # (T, H, D)
        v = torch.cat([vb for _, vb in views])[start : start + num_frames]  # (T, H, D)
        layers.append(torch.cat([k, v], dim=-1))  # (T, H, 2D)
    return torch.stack(layers).permute(0, 2, 1, 3).contiguous()  # (L, H, T, 2D)


class _PagedManager(Protocol):
    """What dense mode uses of ``AttentionCacheManager``: its block bookkeeping."""

    pool: BlockPool
    config: CacheConfig

    def _get_state(self, stream_id: int) -> StreamKVState: ...

    def _check_capacity(self, stream_id: int, state: StreamKVState, num_frames: int) -> int: ...

    def _append_blocks(self, state: StreamKVState, block_ids: Sequence[int]) -> None: ...

    def _commit_frames(self, state: StreamKVState, num_frames: int) -> None: ...


class DenseModeMixin:
    """``commit`` / ``get_stacked_cache`` of ``AttentionCacheManager``: the same blocks,
    bookkeeping and eviction as paged mode, written and read in the packed K|V layout."""

    def commit(self: _PagedManager, stream_id: int, new_kv_chunk: torch.Tensor) -> None:
        """Store a chunk's packed K|V (dense mode): allocate its block, write, account, evict.

        Args:
            new_kv_chunk: (num_layers, n_kv_head, T, 2 * head_dim), T <= block_size_frames; the
                chunk's last T frames of a WeNet-style ``att_cache``.
        Raises:
            ValueError: wrong shape, or T > block_size_frames.
            RuntimeError: stream at capacity, or pool exhausted.
        """
        state = self._get_state(stream_id)
        cfg = self.config
        expected = (cfg.num_layers, cfg.n_kv_head, "T", cfg.kv_last_dim)
        shape = tuple(new_kv_chunk.shape)
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != (expected[0], expected[1], expected[3]):
            raise ValueError(f"new_kv_chunk shape {shape} does not match expected {expected}")
        num_frames = shape[2]
        if num_frames > cfg.block_size_frames:
            raise ValueError(
                f"chunk of {num_frames} frames > block_size_frames ({cfg.block_size_frames}): "
                "dense mode stores one chunk per block"
            )
        new = self._check_capacity(stream_id, state, num_frames)
        self._append_blocks(state, self.pool.allocate(new))
        write_dense_frames(self.pool, state.logical_blocks,
                           state.start + state.num_committed_frames, new_kv_chunk)
        self._commit_frames(state, num_frames)

    def get_stacked_cache(self: _PagedManager, stream_id: int) -> torch.Tensor:
        """The stream's held history as (num_layers, n_kv_head, T_total, 2 * head_dim).

        Usable directly as a WeNet-style ``att_cache`` (K in ``[..., :head_dim]``, V after);
        (L, H, 0, 2D) when nothing is held.
        """
        state = self._get_state(stream_id)
        return gather_dense(self.pool, state.logical_blocks, state.num_committed_frames,
                            state.start)
