"""Tiny CPU geometries for cache tests: 2 layers, 2 heads, 8-16 block pools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from oasr.cache import CacheConfig

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)

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
    return CacheConfig(**{**TINY, **overrides})


@pytest.fixture
def make_config() -> Callable[..., CacheConfig]:
    return tiny_config


def assert_drained(att, pool) -> None:
    """Free every stream still allocated; the pool and slot pool must then be full."""
    for sid in list(att.stream_ids):
        att.free_stream(sid)
    assert pool.num_free_blocks == pool.num_blocks
    assert att.slot_pool.num_free_slots == att.slot_pool.num_slots
    assert all(owner is None for owner in att.block_owner_snapshot())
    assert not att.block_table[: att.config.max_batch_size].any()
    assert not att.cache_seqlens[: att.config.max_batch_size].any()
