"""One test per row of the cache layer's error table (docs/architecture.md)."""

import pytest
import torch

from oasr.cache import AttentionCacheManager, BlockPool, CnnCacheManager, CtcStateCacheManager
from oasr.decoding import GpuDecoderConfig


@pytest.fixture
def managers(make_config):
    cfg = make_config(num_left_chunks=2)
    pool = BlockPool(cfg)
    return (
        pool,
        AttentionCacheManager(pool, cfg),
        CnnCacheManager(cfg),
        CtcStateCacheManager(GpuDecoderConfig(), device="cpu"),
    )


def test_pool_exhausted_raises_requested_vs_free(managers):
    pool, att, _, _ = managers
    pool.allocate(11)
    with pytest.raises(RuntimeError, match="requested 2 blocks, 1 free"):
        pool.allocate(2)


def test_duplicate_allocate_stream_in_all_three_managers(managers):
    _, att, cnn, ctc = managers
    att.allocate_stream(1)
    cnn.allocate_stream(1)
    ctc.allocate_stream(1, vocab_size=4)
    with pytest.raises(ValueError, match="stream 1"):
        att.allocate_stream(1)
    with pytest.raises(ValueError, match="stream 1"):
        cnn.allocate_stream(1)
    with pytest.raises(ValueError, match="stream 1"):
        ctc.allocate_stream(1, vocab_size=4)


def test_freed_or_unknown_stream_is_a_key_error_in_all_three(managers):
    _, att, cnn, ctc = managers
    att.allocate_stream(1)
    cnn.allocate_stream(1)
    ctc.allocate_stream(1, vocab_size=4)
    att.free_stream(1)
    cnn.free_stream(1)
    ctc.free_stream(1)
    with pytest.raises(KeyError):
        att.prepare_chunk(1)
    with pytest.raises(KeyError):
        cnn.get_cache(1)
    with pytest.raises(KeyError):
        ctc.get_decoder(1)
    with pytest.raises(KeyError):
        att.get_stacked_cache(2)


def test_paged_reads_before_prepare_chunk(managers):
    _, att, _, _ = managers
    att.allocate_stream(1)
    with pytest.raises(RuntimeError, match="prepare_chunk"):
        att.get_paged_caches(1)
    with pytest.raises(RuntimeError, match="prepare_chunk"):
        att.get_paged_state_views(1)


def test_shape_mismatch_names_both_shapes(managers):
    _, att, cnn, _ = managers
    att.allocate_stream(1)
    cnn.allocate_stream(1)
    with pytest.raises(ValueError, match=r"\(2, 2, 4, 6\).*\(2, 2, 'T', 8\)"):
        att.commit(1, torch.zeros(2, 2, 4, 6))
    with pytest.raises(ValueError, match=r"\(2, 1, 3, 6\).*\(2, 1, 2, 6\)"):
        cnn.update(1, torch.zeros(2, 1, 3, 6))


def test_dense_chunk_wider_than_a_block(managers):
    _, att, _, _ = managers
    att.allocate_stream(1)
    with pytest.raises(ValueError, match=r"5 frames > block_size_frames \(4\)"):
        att.commit(1, torch.zeros(2, 2, 5, 8))


def test_batched_eviction_is_per_stream(managers):
    pool, att, _, _ = managers
    for sid in (1, 2):
        att.allocate_stream(sid)
    att.prepare_chunks_batched([1])
    att.commit_chunk_paged(1, 4)  # stream 1 is one chunk ahead
    for _ in range(2):
        att.prepare_chunks_batched([1, 2])
        att.commit_chunk_paged(1, 4)
        att.commit_chunk_paged(2, 4)
    assert att.stream_info(1).num_evictions == 1 and att.stream_info(2).num_evictions == 0
    assert att.block_table[:2, :3].tolist() == [[1, 3, 0], [2, 4, 0]]
    assert pool.allocate(1) == [5]  # evicted block 0 went to the tail of the free list
    assert att.cache_seqlens.tolist() == [8, 8, 0]
