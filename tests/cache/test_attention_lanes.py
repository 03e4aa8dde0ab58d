"""Pad lanes, scratch blocks and the prefilled (zeroed) K/V window."""

import pytest
import torch
from cache_helpers import assert_drained
from support.pool_views import fill_blocks, pool_k, pool_v

from oasr.cache import AttentionCacheManager, BlockPool
from oasr.fmha import write_chunk_kv


def build(make_config, pad_lanes=1, scratch=1, **overrides):
    cfg = make_config(**overrides)
    pool = BlockPool(cfg, scratch_blocks=scratch)
    return AttentionCacheManager(pool, cfg, pad_lanes=pad_lanes), pool


def test_pad_lane_row_points_only_at_scratch(make_config):
    att, pool = build(make_config)
    assert att.pad_lane_slots == (3,)
    assert att.block_table[3].tolist() == [12] * 8
    assert att.cache_seqlens[3].item() == 0


def test_pad_lanes_need_a_scratch_block(make_config):
    with pytest.raises(ValueError, match="scratch_blocks=1"):
        build(make_config, pad_lanes=1, scratch=0)


def test_padded_batch_and_padding_writes_only_scratch(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    att.allocate_stream(2)
    att.prepare_chunks_batched([1, 2])
    caches = att.get_batched_paged_caches([2, 1], pad_to=4)
    assert att.batch_slot_list([2, 1], pad_to=4) == [1, 0, 3, 3]
    bt = caches[0].block_table
    assert bt.shape == (4, 8)
    assert bt[2].tolist() == [12] * 8 and bt[3].tolist() == [12] * 8
    assert caches[0].cache_seqlens.tolist() == [0, 0, 0, 0]
    k = torch.zeros(4, 4, 2, 4)
    k[2:] = 5.0  # the padding rows
    for cache in caches:
        write_chunk_kv(cache, k, k)
    assert torch.all(pool_k(pool)[:, 12] == 5.0)
    assert not pool_k(pool)[:, :12].any() and not pool_v(pool)[:, :12].any()
    with pytest.raises(ValueError, match="no pad lanes"):
        build(make_config, pad_lanes=0, scratch=0)[0].batch_slot_list([], pad_to=1)


def test_scratch_and_pad_lane_never_handed_out(make_config):
    att, pool = build(make_config, num_left_chunks=-1, max_num_blocks=12, max_batch_size=3)
    for sid in (1, 2, 3):
        assert att.allocate_stream(sid) in (0, 1, 2)
    for _ in range(4):
        att.prepare_chunks_batched([1, 2, 3])
        for sid in (1, 2, 3):
            att.commit_chunk_paged(sid, 4)
    assert pool.num_free_blocks == 0
    owned = [b for sid in (1, 2, 3) for b in att.stream_info(sid).block_ids]
    assert sorted(owned) == list(range(12))
    assert att.block_owner_snapshot()[12] is None
    assert att.block_table[3].tolist() == [12] * 8  # untouched by everything above
    with pytest.raises(RuntimeError, match="all 3 slots"):
        att.allocate_stream(4)
    for sid in (1, 2, 3):
        att.reset_stream(sid)
    assert pool.num_free_blocks == 12
    assert_drained(att, pool)
    assert sorted(pool.allocate(12)) == list(range(12))  # scratch block 12 never among them


def test_prefill_hands_a_zeroed_window(make_config):
    att, pool = build(make_config, num_left_chunks=2, prefill_kv_window=True)
    fill_blocks(pool, float("nan"))
    att.allocate_stream(1)
    info = att.stream_info(1)
    assert info.block_ids == (0, 1) and info.num_cached_frames == 8
    assert not pool_k(pool)[:, [0, 1]].isnan().any() and not pool_k(pool)[:, [0, 1]].any()
    assert not pool_v(pool)[:, [0, 1]].any()
    assert pool_k(pool)[:, 2].isnan().all()  # only the window is zeroed
    assert att.cache_seqlens.tolist() == [8, 0, 0, 8]  # pad lane starts at the same length
    assert torch.equal(att.get_stacked_cache(1), torch.zeros(2, 2, 8, 8))


def test_prefill_keeps_cache_length_constant(make_config):
    att, pool = build(make_config, num_left_chunks=2, prefill_kv_window=True)
    att.allocate_stream(1)
    att.allocate_stream(2)
    rows = []
    for _ in range(3):
        att.prepare_chunks_batched([1, 2])
        caches = att.get_batched_paged_caches([1, 2], pad_to=3)
        assert caches[0].cache_seqlens.tolist() == [8, 8, 8]
        assert caches[0].host_seqlen == 8
        att.commit_chunk_paged(1, 4)
        att.commit_chunk_paged(2, 4)
        rows.append(att.stream_info(1).block_ids)
    assert att.cached_frames([1, 2]).tolist() == [8, 8]
    assert rows == [(1, 4), (4, 6), (6, 8)]  # prefill 0,1 (stream 1), 2,3 (stream 2)
    assert att.num_evictions == 6


def test_reset_re_prefills_a_zeroed_window(make_config):
    att, pool = build(make_config, num_left_chunks=2, prefill_kv_window=True)
    att.allocate_stream(1)
    for _ in range(2):
        att.prepare_chunk(1)
        att.commit_chunk_paged(1, 4)
    fill_blocks(pool, 1.0, list(range(12)))
    att.reset_stream(1)
    info = att.stream_info(1)
    assert info.num_cached_frames == 8 and len(info.block_ids) == 2
    assert not pool_k(pool)[:, list(info.block_ids)].any()
    assert att.slot_of(1) == 0
    assert_drained(att, pool)


def test_prefill_that_does_not_fit_releases_the_slot(make_config):
    att, pool = build(make_config, num_left_chunks=2, prefill_kv_window=True, max_num_blocks=9)
    att.allocate_stream(1)
    taken = pool.allocate(6)  # blocks held outside this manager leave 1 free
    with pytest.raises(RuntimeError, match="requested 2 blocks, 1 free"):
        att.allocate_stream(2)
    assert 2 not in att and att.stream_ids == [1]
    pool.free(taken)
    assert att.allocate_stream(2) == 1  # the slot it was refused is unbound again
    assert_drained(att, pool)
