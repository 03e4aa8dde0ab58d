"""Dense (packed K|V) access to a stream's blocks: the layout of a WeNet-style ``att_cache``.

The dense layout is (num_layers, n_kv_head, T, 2 * head_dim) with K in ``[..., :head_dim]``
and V in ``[..., head_dim:]``; the pool layout is (num_layers, blocks, block_size, heads, dim).
Frame p of a stream lives in ``block_ids[p // block_size]`` at slot ``p % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oasr.cache.block_pool import BlockPool


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
        pool.k_pool[:, block, offset : offset + n].copy_(k[:, t : t + n])  # (L, n, H, D)
        pool.v_pool[:, block, offset : offset + n].copy_(v[:, t : t + n])
        t += n


def gather_dense(pool: BlockPool, block_ids: Sequence[int], num_frames: int) -> torch.Tensor:
    """The first ``num_frames`` frames of the stream as (num_layers, n_kv_head, T, 2 * head_dim).

    A new contiguous tensor; (L, H, 0, 2D) when ``num_frames`` is 0.
    """
    cfg = pool.config
    if num_frames == 0 or not block_ids:
        shape = (cfg.num_layers, cfg.n_kv_head, 0, cfg.kv_last_dim)
        return torch.zeros(shape, dtype=cfg.dtype, device=cfg.device)
    k = torch.cat([pool.k_pool[:, b] for b in block_ids], dim=1)[:, :num_frames]  # (L, T, H, D)
    v = torch.cat([pool.v_pool[:, b] for b in block_ids], dim=1)[:, :num_frames]  # (L, T, H, D)
    return torch.cat([k, v], dim=-1).permute(0, 2, 1, 3).contiguous()  # (L, H, T, 2D)
