import logging

import pytest
import torch

from oasr.cache import CacheConfig
from oasr.cache.types import default_device


def test_defaults_follow_the_seed():
    cfg = CacheConfig()
    assert (cfg.num_layers, cfg.n_kv_head, cfg.head_dim, cfg.hidden_dim) == (12, 4, 64, 256)
    assert (cfg.kernel_size, cfg.chunk_size, cfg.num_left_chunks) == (15, 16, -1)
    assert (cfg.block_size_frames, cfg.max_num_blocks, cfg.max_blocks_per_seq) == (16, 1024, 512)
    assert cfg.dtype == torch.bfloat16
    assert cfg.device == default_device()
    assert cfg.prefill_kv_window is False


def test_derived_properties_with_eviction(make_config):
    cfg = make_config(chunk_size=4, block_size_frames=8, num_left_chunks=3)
    assert cfg.kv_last_dim == 8
    assert cfg.cnn_cache_frames == 2
    assert cfg.max_logical_blocks == 2  # ceil(4 * 3 / 8)
    assert cfg.blocks_per_stream == 2
    assert cfg.max_stream_frames == 16
    assert cfg.has_eviction


def test_derived_properties_unlimited_history(make_config):
    cfg = make_config(num_left_chunks=-1, max_num_blocks=12, max_batch_size=3, max_blocks_per_seq=8)
    assert cfg.max_logical_blocks is None
    assert cfg.blocks_per_stream == 4  # min(8, 12 // 3)
    assert cfg.max_stream_frames == 16
    assert not cfg.has_eviction
    assert make_config(max_blocks_per_seq=2).blocks_per_stream == 2


def test_shipped_default_ceiling_is_64_blocks():
    cfg = CacheConfig(max_num_blocks=2048, max_batch_size=32)
    assert cfg.blocks_per_stream == 64
    assert cfg.max_stream_frames == 1024


def test_zero_left_chunks_keeps_no_history(make_config):
    assert make_config(num_left_chunks=0).max_logical_blocks == 0


def test_rejects_chunk_wider_than_block(make_config):
    with pytest.raises(ValueError, match=r"chunk_size \(8\) > block_size_frames \(4\).*block_size_frames=8"):
        make_config(chunk_size=8, block_size_frames=4)


def test_rejects_block_table_too_narrow_for_history(make_config):
    with pytest.raises(ValueError, match=r"max_blocks_per_seq \(4\).*>= 5"):
        make_config(num_left_chunks=4, max_blocks_per_seq=4, max_num_blocks=15)
    assert make_config(num_left_chunks=4, max_blocks_per_seq=5,
                       max_num_blocks=15).max_logical_blocks == 4


def test_rejects_pool_with_no_share_per_stream(make_config):
    with pytest.raises(ValueError, match=r"max_num_blocks \(2\) < max_batch_size \(3\)"):
        make_config(max_num_blocks=2)


@pytest.mark.parametrize(
    "field,value",
    [("num_layers", 0), ("head_dim", -1), ("chunk_size", 1.5), ("max_batch_size", True),
     ("num_left_chunks", -2)],
)
def test_rejects_bad_fields(make_config, field, value):
    with pytest.raises(ValueError, match=field):
        make_config(**{field: value})


def test_rejects_integer_dtype(make_config):
    with pytest.raises(ValueError, match="dtype"):
        make_config(dtype=torch.int32)


def test_prefill_needs_bounded_window(make_config):
    with pytest.raises(ValueError, match="prefill_kv_window.*num_left_chunks"):
        make_config(prefill_kv_window=True, num_left_chunks=-1)
    cfg = make_config(prefill_kv_window=True, num_left_chunks=2)
    assert cfg.prefill_frames == 8


def test_is_frozen_and_device_normalised(make_config):
    cfg = make_config(device="cpu")
    assert cfg.device == torch.device("cpu")
    with pytest.raises(AttributeError):
        cfg.chunk_size = 8  # type: ignore[misc]


def test_logs_ceiling_when_history_unlimited(make_config, caplog):
    with caplog.at_level(logging.INFO, logger="oasr.cache.types"):
        make_config(num_left_chunks=-1)
    assert any("4 blocks = 16 encoder frames" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="oasr.cache.types"):
        make_config(num_left_chunks=2)
    assert not caplog.records


def test_rejects_a_bounded_pool_smaller_than_its_streams():
    """Seed §10.2: with eviction each stream's footprint is bounded, so the pool must hold
    max_batch_size of them at their peak (the retained window plus the in-flight block)."""
    with pytest.raises(ValueError, match=r"max_num_blocks \(8\) cannot hold max_batch_size \(32\)"
                       r".*5 x 32 = 160; raise max_num_blocks to 160, lower max_batch_size to 1"):
        CacheConfig(num_left_chunks=4, max_num_blocks=8, max_batch_size=32)
    assert CacheConfig(num_left_chunks=4, max_num_blocks=160, max_batch_size=32) \
        .peak_blocks_per_stream == 5
    with pytest.raises(ValueError, match=r"raise max_num_blocks to 15 or lower num_left_chunks"):
        CacheConfig(num_left_chunks=4, max_num_blocks=4, max_batch_size=3)


def test_prefilled_window_needs_one_block_per_chunk(make_config):
    """A chunk smaller than a block makes the held window alternate, which defeats a prefilled
    window's purpose (one cached length for every stream, every step)."""
    with pytest.raises(ValueError, match=r"chunk_size == block_size_frames \(got 2 and 4\).*"
                       r"alternating between 6 and 8 frames.*block_size_frames=2"):
        make_config(chunk_size=2, num_left_chunks=4, prefill_kv_window=True)


@pytest.mark.parametrize("chunk, expected", [(4, [8] * 6), (2, [2, 4, 6, 8, 6, 8, 6, 8, 6])])
def test_held_window_is_uniform_only_with_one_block_per_chunk(make_config, chunk, expected):
    """What the rule above protects: chunks of a block keep the held length fixed at the
    window; half-block chunks (allowed without a prefill) alternate."""
    from oasr.cache import AttentionCacheManager, BlockPool

    prefill = chunk == 4
    cfg = make_config(chunk_size=chunk, num_left_chunks=8 // chunk, prefill_kv_window=prefill)
    att = AttentionCacheManager(BlockPool(cfg), cfg)
    att.allocate_stream(1)
    held = []
    for _ in range(len(expected)):
        att.prepare_chunk(1)
        att.commit_chunk_paged(1, chunk)
        held.append(att.num_cached_frames(1))
    assert held == expected
