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


@pytest.mark.parametrize("chunk, block, retained, peak", [
    (4, 4, 4, 5),  # one block per chunk
    (2, 4, 3, 3),  # two chunks per block: the history may begin half way into its first block
    (8, 4, 8, 10),  # a chunk of two blocks
    (6, 4, 7, 8),  # chunks across block edges: the history begins on a grid of 2 frames
])
def test_every_chunk_and_block_size_holds_its_window(make_config, chunk, block, retained, peak):
    """Four chunks of history at any geometry: the blocks a stream retains after a commit
    and holds with a chunk in flight (the history may begin up to block - gcd(chunk, block)
    frames into its first block)."""
    cfg = make_config(chunk_size=chunk, block_size_frames=block, num_left_chunks=4,
                      max_num_blocks=3 * peak, max_blocks_per_seq=peak)
    assert cfg.history_frames == 4 * chunk
    assert cfg.max_logical_blocks == retained and cfg.peak_blocks_per_stream == peak
    with pytest.raises(ValueError, match=rf"max_blocks_per_seq \({peak - 1}\).*>= {peak}"):
        make_config(chunk_size=chunk, block_size_frames=block, num_left_chunks=4,
                    max_num_blocks=3 * peak, max_blocks_per_seq=peak - 1)


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


@pytest.mark.parametrize("chunk", [4, 2, 8, 6])
@pytest.mark.parametrize("prefill", [True, False])
def test_held_window_is_the_last_chunks_at_every_geometry(make_config, chunk, prefill):
    """Eviction by frame: after every chunk a stream holds exactly its last num_left_chunks
    chunks (from the start with a prefilled window), whether chunks are one block, half a
    block, two blocks or straddle block edges."""
    from oasr.cache import AttentionCacheManager, BlockPool

    left = 2
    window = left * chunk
    cfg = make_config(chunk_size=chunk, num_left_chunks=left, prefill_kv_window=prefill,
                      max_num_blocks=40, max_blocks_per_seq=10)
    att = AttentionCacheManager(BlockPool(cfg), cfg)
    att.allocate_stream(1)
    held, blocks = [], []
    for k in range(1, 9):
        att.prepare_chunk(1)
        blocks.append(len(att.stream_info(1).block_ids))
        att.commit_chunk_paged(1, chunk)
        held.append(att.num_cached_frames(1))
        assert held[-1] == (window if prefill else min(k * chunk, window))
    assert max(blocks) <= cfg.peak_blocks_per_stream
