"""Shared helpers for cache tests: tiny CPU geometries and the drained-pool check."""

from __future__ import annotations

from typing import Any

import torch

from oasr.cache import AttentionCacheManager, BlockPool, CacheConfig

TINY = dict(
    num_layers=2,
    n_kv_head=2,
    head_dim=4,
    hidden_dim=6,
    kernel_size=3,
    chunk_size=4,
    block_size_frames=4,
    max_num_blocks=12,
    max_blocks_per_seq=8,
    max_batch_size=3,
    device="cpu",
    dtype=torch.float32,
)


def tiny_config(**overrides: Any) -> CacheConfig:
    """2 layers, 2 heads of dim 4, 4-frame chunks and blocks, 12 blocks, 3 slots (overridable)."""
    return CacheConfig(**{**TINY, **overrides})


def assert_drained(att: AttentionCacheManager, pool: BlockPool) -> None:
    """Free every stream still allocated; the pool must then be full and no slot bound."""
    for sid in list(att.stream_ids):
        att.free_stream(sid)
    assert pool.num_free_blocks == pool.num_blocks
    assert att.num_streams == 0 and att.stream_ids == []
    assert all(owner is None for owner in att.block_owner_snapshot())
    assert not att.block_table[: att.config.max_batch_size].any()
    assert not att.cache_seqlens[: att.config.max_batch_size].any()
