"""Shared helpers for cache tests: tiny CPU geometries and the drained-pool check."""

from __future__ import annotations

from typing import Any

import torch

from oasr.cache import (
    AttentionCacheManager,
    BlockPool,
    CacheConfig,
    CnnCacheManager,
    CtcStateCacheManager,
)
from oasr.decoding import GpuDecoderConfig

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


def fbank_windows(feats: torch.Tensor) -> list[torch.Tensor]:
    """(1, <=67, 80) windows with stride 64: the chunks a streaming feature extractor emits."""
    return [feats[None, s : s + 67] for s in range(0, feats.size(0) - 6, 64)]


def managers(config: CacheConfig, pad_lanes: int = 0) -> tuple[Any, ...]:
    """(pool, attention, conv, CTC) managers of ``config``, with ``pad_lanes`` pad rows."""
    pool = BlockPool(config, scratch_blocks=1 if pad_lanes else 0)
    att = AttentionCacheManager(pool, config, pad_lanes=pad_lanes)
    cnn = CnnCacheManager(config, pad_lanes=pad_lanes)
    ctc = CtcStateCacheManager(GpuDecoderConfig(), device=config.device)
    return pool, att, cnn, ctc
