import pytest
import torch

from oasr.cache import BlockPool, CacheConfig
from oasr.engine.config import EngineConfig
from oasr.engine.families.base import KVGeometry
from oasr.engine.runner.memory import (
    PoolDemand,
    available_memory_bytes,
    bytes_per_kv_block,
    cache_config_for,
    derive_num_blocks,
    kv_pool_bytes,
)

TINY = dict(num_layers=3, n_kv_head=2, head_dim=8, hidden_dim=16, kernel_size=3, chunk_size=4,
            block_size_frames=4, max_num_blocks=10, max_blocks_per_seq=8, max_batch_size=2,
            device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("scratch", [0, 1])
def test_formula_matches_a_real_pool_allocation(dtype, scratch):
    cfg = CacheConfig(**TINY, dtype=dtype)
    pool = BlockPool(cfg, scratch_blocks=scratch)
    allocated = sum(t.untyped_storage().nbytes() for t in pool.get_kv_view(0))
    assert kv_pool_bytes(cfg, scratch) == allocated
    assert bytes_per_kv_block(cfg) * (10 + scratch) == allocated
    one_block = sum(t.nbytes for t in pool.get_kv_block_view(0, 0)) * cfg.num_layers
    assert bytes_per_kv_block(cfg) == one_block


def test_default_geometry_is_192_kib_per_fp16_block():
    cfg = CacheConfig(device="cpu", dtype=torch.float16)
    assert bytes_per_kv_block(cfg) == 192 * 1024
    assert kv_pool_bytes(CacheConfig(device="cpu", dtype=torch.float16, max_num_blocks=2048)) == 384 * 2**20


def demand(peak_blocks_per_stream=None):
    """TINY's pool demand: 2 slots, 8-column tables, 1536-byte blocks (float32)."""
    return PoolDemand(block_bytes=1536, num_slots=2, max_blocks_per_seq=8,
                      peak_blocks_per_stream=peak_blocks_per_stream, device=torch.device("cpu"))


def test_derive_unlimited_history_fills_the_budget():
    cfg = CacheConfig(**TINY, dtype=torch.float32)  # 3*4*2*8*4*2 = 1536 bytes per block
    assert bytes_per_kv_block(cfg) == 1536
    assert derive_num_blocks(demand(), 0.5, available_bytes=1536 * 14) == 7
    assert derive_num_blocks(demand(), 1.0, available_bytes=1536 * 100) == 16  # 2 slots * 8 columns


def test_derive_with_eviction_is_exactly_the_bounded_need():
    cfg = CacheConfig(**{**TINY, "num_left_chunks": 2}, dtype=torch.float32)
    bounded = demand(cfg.peak_blocks_per_stream)
    assert bounded.min_blocks == 2 * 3
    assert derive_num_blocks(bounded, 1.0, available_bytes=1536 * 1000) == 6
    with pytest.raises(RuntimeError, match="holds 5 blocks of 1536 bytes, but 2 streams need 6"):
        derive_num_blocks(bounded, 1.0, available_bytes=1536 * 5)


def test_derive_rejects_too_small_budget_and_bad_fraction():
    with pytest.raises(RuntimeError, match="holds 1 blocks"):
        derive_num_blocks(demand(), 1.0, available_bytes=1536 * 1)
    with pytest.raises(ValueError, match="memory_fraction"):
        derive_num_blocks(demand(), 0.0, available_bytes=10**9)


@pytest.mark.parametrize("left", [-1, 2])
def test_cache_config_for_sizes_the_pool_before_it_builds_the_config(left):
    """The derived count is what the demand of the built config's own geometry derives."""
    geometry = KVGeometry(num_layers=3, n_kv_head=2, head_dim=8, hidden_dim=16, kernel_size=3)
    config = EngineConfig(max_batch_size=2, chunk_size=4, num_left_chunks=left,
                          max_blocks_per_seq=8, kv_memory_fraction=0.001)
    cfg = cache_config_for(config, geometry, torch.device("cpu"), torch.float32)
    peak = cfg.peak_blocks_per_stream if cfg.has_eviction else None
    built = PoolDemand(bytes_per_kv_block(cfg), cfg.max_batch_size, cfg.max_blocks_per_seq, peak,
                       cfg.device)
    assert cfg.max_num_blocks == derive_num_blocks(built, 0.001)
    assert cfg.max_num_blocks == (6 if left == 2 else 16)  # bounded need; the tables' ceiling


def test_available_memory_is_positive_on_cpu():
    assert available_memory_bytes("cpu") > 0
