"""Dense mode, and agreement of dense and paged storage of the same frames."""

import pytest
import torch
from cache_helpers import assert_drained
from support.pool_views import pool_k

from oasr.cache import AttentionCacheManager, BlockPool
from oasr.fmha import write_chunk_kv


def build(make_config, **overrides):
    cfg = make_config(**overrides)
    pool = BlockPool(cfg)
    return AttentionCacheManager(pool, cfg), pool


def kv_chunk(seed, frames=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, frames, 8, generator=g)  # (L, H, T, 2D)


def test_empty_stacked_cache(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    empty = att.get_stacked_cache(1)
    assert empty.shape == (2, 2, 0, 8) and empty.dtype == torch.float32


def test_commit_then_stack_unlimited(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    att.allocate_stream(1)
    chunks = [kv_chunk(i) for i in range(3)] + [kv_chunk(9, frames=2)]
    for c in chunks:
        att.commit(1, c)
    assert att.stream_info(1).block_ids == (0, 1, 2, 3)
    assert att.cache_seqlens[0].item() == 14
    assert torch.equal(att.get_stacked_cache(1), torch.cat(chunks, dim=2))
    assert_drained(att, pool)


def test_dense_eviction_keeps_the_last_window(make_config):
    att, pool = build(make_config, num_left_chunks=2)
    att.allocate_stream(1)
    chunks = [kv_chunk(i) for i in range(5)]
    for i, c in enumerate(chunks):
        att.commit(1, c)
        expected = torch.cat(chunks[max(0, i - 1) : i + 1], dim=2)
        assert torch.equal(att.get_stacked_cache(1), expected)
    assert att.stream_info(1).block_ids == (3, 4)
    assert att.num_evictions == 3
    assert_drained(att, pool)


def test_dense_chunks_smaller_than_blocks_straddle(make_config):
    att, pool = build(make_config, chunk_size=3, block_size_frames=4, num_left_chunks=-1)
    att.allocate_stream(1)
    chunks = [kv_chunk(i, frames=3) for i in range(3)]
    for c in chunks:
        att.commit(1, c)
    assert att.stream_info(1).block_ids == (0, 1, 2)
    assert torch.equal(att.get_stacked_cache(1), torch.cat(chunks, dim=2))
    k = torch.cat(chunks, dim=2)[..., :4].permute(0, 2, 1, 3)  # (L, 9, H, D)
    assert torch.equal(pool_k(pool)[:, 1], k[:, 4:8])  # frames 4..7 in logical block 1
    assert_drained(att, pool)


def test_commit_shape_errors(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    with pytest.raises(ValueError, match=r"shape \(2, 3, 4, 8\) does not match expected \(2, 2, 'T', 8\)"):
        att.commit(1, torch.zeros(2, 3, 4, 8))
    with pytest.raises(ValueError, match="does not match expected"):
        att.commit(1, torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match=r"chunk of 5 frames > block_size_frames \(4\)"):
        att.commit(1, torch.zeros(2, 2, 5, 8))
    assert pool.num_free_blocks == 12


def test_dense_commit_respects_capacity(make_config):
    att, pool = build(make_config, num_left_chunks=-1)  # 4 blocks per stream
    att.allocate_stream(1)
    for i in range(4):
        att.commit(1, kv_chunk(i))
    with pytest.raises(RuntimeError, match="at capacity"):
        att.commit(1, kv_chunk(5))
    assert att.num_cached_frames(1) == 16


@pytest.mark.parametrize("left", [-1, 2])
def test_paged_writes_read_back_densely(make_config, left):
    """Frames written by fmha through the batched caches land where the dense reader looks."""
    att, pool = build(make_config, num_left_chunks=left)
    sids = [3, 8]
    for sid in sids:
        att.allocate_stream(sid)
    history = {sid: [] for sid in sids}
    for step in range(4):
        att.prepare_chunks_batched(sids)
        caches = att.get_batched_paged_caches(sids)
        frames = {3: 4, 8: 4 if step < 3 else 2}
        for layer, cache in enumerate(caches):
            kv = torch.stack([kv_chunk(100 * step + 10 * layer + sid)[layer] for sid in sids])
            k = kv[..., :4].permute(0, 2, 1, 3)  # (B, T, H, D)
            v = kv[..., 4:].permute(0, 2, 1, 3)
            write_chunk_kv(cache, k, v)
        for sid in sids:
            chunk = torch.stack(
                [kv_chunk(100 * step + 10 * layer + sid)[layer] for layer in range(2)]
            )[:, :, : frames[sid]]
            history[sid].append(chunk)
            att.commit_chunk_paged(sid, frames[sid])
    for sid in sids:
        expected = torch.cat(history[sid], dim=2)
        held = att.num_cached_frames(sid)
        assert torch.equal(att.get_stacked_cache(sid), expected[:, :, expected.size(2) - held :])
    assert_drained(att, pool)
