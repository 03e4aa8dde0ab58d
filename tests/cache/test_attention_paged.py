"""Paged mode of AttentionCacheManager on 12-block pools: exact ids, lengths, eviction order."""

import pytest
import torch
from cache_helpers import assert_drained

from oasr.cache import AttentionCacheManager, BlockPool


def build(make_config, pad_lanes=0, scratch=0, **overrides):
    cfg = make_config(**overrides)
    pool = BlockPool(cfg, scratch_blocks=scratch)
    return AttentionCacheManager(pool, cfg, pad_lanes=pad_lanes), pool


def row(att, sid):
    return att.block_table[att.slot_of(sid)].tolist()


def step(att, sid, frames=4):
    att.prepare_chunk(sid)
    att.commit_chunk_paged(sid, frames)


def test_slots_are_lowest_free(make_config):
    att, pool = build(make_config)
    assert att.allocate_stream(10) == 0
    assert att.allocate_stream(11) == 1
    att.free_stream(10)
    assert att.allocate_stream(12) == 0
    assert att.slot_of(11) == 1
    assert att.num_streams == 2 and 12 in att and 10 not in att
    assert_drained(att, pool)


def test_unlimited_history_exact_ids_and_lengths(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    att.allocate_stream(1)
    att.allocate_stream(2)
    step(att, 1)
    step(att, 2)
    step(att, 1)
    assert row(att, 1) == [0, 2, 0, 0, 0, 0, 0, 0]
    assert row(att, 2) == [1, 0, 0, 0, 0, 0, 0, 0]
    assert att.cache_seqlens.tolist() == [8, 4, 0]
    assert att.num_evictions == 0
    assert pool.num_free_blocks == 9
    assert att.block_owner_snapshot() == [1, 2, 1] + [None] * 9
    assert_drained(att, pool)


def test_eviction_is_fifo_left_shift(make_config):
    att, pool = build(make_config, num_left_chunks=2)  # 2 retained blocks
    att.allocate_stream(5)
    seqlens, rows = [], []
    for _ in range(5):
        step(att, 5)
        seqlens.append(att.cache_seqlens[0].item())
        rows.append(row(att, 5)[:4])
    assert seqlens == [4, 8, 8, 8, 8]
    assert rows == [[0, 0, 0, 0], [0, 1, 0, 0], [1, 2, 0, 0], [2, 3, 0, 0], [3, 4, 0, 0]]
    assert att.num_evictions == 3
    assert att.stream_info(5).num_evictions == 3
    assert att.stream_info(5).num_total_frames == 20
    # evicted ids went to the tail of the free list, in eviction order
    assert pool.allocate(10) == [5, 6, 7, 8, 9, 10, 11, 0, 1, 2]
    pool.free([5, 6, 7, 8, 9, 10, 11, 0, 1, 2])
    assert_drained(att, pool)


def test_in_flight_block_during_forward(make_config):
    att, pool = build(make_config, num_left_chunks=2)
    att.allocate_stream(5)
    for _ in range(2):
        step(att, 5)
    att.prepare_chunk(5)  # third block for the chunk in flight, before eviction
    assert row(att, 5)[:4] == [0, 1, 2, 0]
    assert att.cached_frames([5]).tolist() == [8]
    att.commit_chunk_paged(5, 4)
    assert row(att, 5)[:4] == [1, 2, 0, 0]
    assert_drained(att, pool)


def test_streams_evict_independently(make_config):
    att, pool = build(make_config, num_left_chunks=1)
    att.allocate_stream(1)
    att.allocate_stream(2)
    att.prepare_chunks_batched([1, 2])  # 1 -> 0, 2 -> 1
    att.commit_chunk_paged(1, 4)
    att.commit_chunk_paged(2, 4)
    att.prepare_chunks_batched([1, 2])  # 1 -> 2, 2 -> 3
    att.commit_chunk_paged(1, 4)  # evicts 0 only
    assert row(att, 1)[:2] == [2, 0] and row(att, 2)[:2] == [1, 3]
    assert att.cache_seqlens.tolist()[:2] == [4, 4]
    assert att.stream_info(1).num_evictions == 1 and att.stream_info(2).num_evictions == 0
    att.commit_chunk_paged(2, 2)
    assert row(att, 2)[:2] == [3, 0]
    assert att.cache_seqlens.tolist()[:2] == [4, 2]
    assert att.num_evictions == 2
    assert_drained(att, pool)


def test_chunk_smaller_than_block_shares_blocks(make_config):
    """Two chunks per block, two chunks of history: the history is always the last 4 frames,
    beginning half way into its first block every other chunk (evicted by frame)."""
    att, pool = build(make_config, chunk_size=2, block_size_frames=4, num_left_chunks=2)
    assert att.config.max_logical_blocks == 2 and att.config.peak_blocks_per_stream == 2
    att.allocate_stream(3)
    seen = []
    for _ in range(5):
        att.prepare_chunk(3)
        blocks_in_flight = att.stream_info(3).block_ids
        att.commit_chunk_paged(3, 2)
        slot = att.slot_of(3)
        seen.append((blocks_in_flight, att.stream_info(3).block_ids, att.num_cached_frames(3),
                     att.cache_starts[slot].item(), att.cache_seqlens[slot].item()))
    assert seen == [
        ((0,), (0,), 2, 0, 2),
        ((0,), (0,), 4, 0, 4),
        ((0, 1), (0, 1), 4, 2, 6),  # frames 2..5: block 0 from its third frame
        ((0, 1), (1,), 4, 0, 4),
        ((1, 2), (1, 2), 4, 2, 6),
    ]
    assert_drained(att, pool)


def test_a_short_chunk_never_takes_a_stream_past_its_peak_blocks(make_config):
    """A short chunk moves the history off the chunks' grid; it stays exact but where it
    would begin further into its first block than full chunks ever leave it (here its last
    frame), that frame goes too, so a stream never needs more than
    `peak_blocks_per_stream` blocks."""
    att, pool = build(make_config, chunk_size=2, block_size_frames=4, num_left_chunks=2)
    att.allocate_stream(1)
    seen = []
    for frames in (2, 2, 1, 2, 2, 2):
        step(att, 1, frames)
        seen.append((att.num_cached_frames(1), att.cache_starts[att.slot_of(1)].item()))
        assert len(att.stream_info(1).block_ids) <= att.config.peak_blocks_per_stream
    # 5 frames: the last 4 begin at frame 1; 7: at frame 3, past 4 - 2, so frame 3 goes
    assert seen == [(2, 0), (4, 0), (4, 1), (3, 0), (4, 1), (3, 0)]
    assert_drained(att, pool)


def test_zero_left_chunks_keeps_nothing(make_config):
    att, pool = build(make_config, num_left_chunks=0)
    att.allocate_stream(1)
    for frames in (4, 3):
        step(att, 1, frames)
        assert att.num_cached_frames(1) == 0
        assert row(att, 1)[0] == 0 and pool.num_free_blocks == 12
    assert att.num_evictions == 2
    assert_drained(att, pool)


def test_short_last_chunk_then_capacity(make_config):
    att, pool = build(make_config, num_left_chunks=-1)  # 12 // 3 = 4 blocks per stream
    att.allocate_stream(1)
    for _ in range(3):
        assert not att.at_capacity(1)
        step(att, 1)
    step(att, 1, 3)  # short: 15 frames in 4 blocks
    assert att.num_cached_frames(1) == 15
    assert att.at_capacity(1)  # a full chunk would need a fifth block
    with pytest.raises(RuntimeError, match="stream 1 is at capacity.*max_stream_frames=16"):
        att.prepare_chunk(1)
    assert pool.num_free_blocks == 8
    assert_drained(att, pool)


def test_at_capacity_exactly_at_ceiling(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    att.allocate_stream(1)
    for _ in range(4):
        step(att, 1)
    assert att.num_cached_frames(1) == att.config.max_stream_frames == 16
    assert att.at_capacity(1)
    att.allocate_stream(2)
    assert not att.at_capacity(2)
    assert_drained(att, pool)


def test_never_at_capacity_with_eviction(make_config):
    att, pool = build(make_config, num_left_chunks=2)
    att.allocate_stream(1)
    for _ in range(20):
        assert not att.at_capacity(1)
        step(att, 1)
    assert pool.num_free_blocks == 10
    assert_drained(att, pool)


def test_batched_prepare_equals_single_prepares(make_config):
    single, pool_a = build(make_config, num_left_chunks=2)
    batched, pool_b = build(make_config, num_left_chunks=2)
    sids = [7, 3, 9]
    for att in (single, batched):
        for sid in sids:
            att.allocate_stream(sid)
    for chunk in range(4):
        for sid in sids:
            single.prepare_chunk(sid)
        batched.prepare_chunks_batched(sids)
        assert torch.equal(single.block_table, batched.block_table)
        for sid in sids:
            frames = 4 if chunk < 3 else sid % 4
            single.commit_chunk_paged(sid, frames)
            batched.commit_chunk_paged(sid, frames)
        assert torch.equal(single.block_table, batched.block_table)
        assert torch.equal(single.cache_seqlens, batched.cache_seqlens)
    assert pool_a.allocate(pool_a.num_free_blocks) == pool_b.allocate(pool_b.num_free_blocks)


def test_batched_prepare_fails_atomically(make_config):
    att, pool = build(make_config, num_left_chunks=-1, max_num_blocks=6, max_batch_size=2)
    att.allocate_stream(1)
    att.allocate_stream(2)
    for _ in range(2):
        step(att, 1)
    step(att, 2)
    hog = pool.allocate(2)
    with pytest.raises(RuntimeError, match="requested 2 blocks, 1 free"):
        att.prepare_chunks_batched([1, 2])
    assert att.stream_info(1).block_ids == (0, 1) and att.stream_info(2).block_ids == (2,)
    pool.free(hog)
    with pytest.raises(ValueError, match="repeat"):
        att.prepare_chunks_batched([1, 1])
    step(att, 1)  # third and last block of stream 1
    assert att.at_capacity(1)
    with pytest.raises(RuntimeError, match="stream 1 is at capacity"):
        att.prepare_chunks_batched([2, 1])
    assert att.stream_info(2).block_ids == (2,) and pool.num_free_blocks == 2
    assert_drained(att, pool)


def test_pool_exhaustion_from_prepare(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    pool.allocate(12)
    att.allocate_stream(1)
    with pytest.raises(RuntimeError, match="requested 1 blocks, 0 free"):
        att.prepare_chunk(1)


def test_cached_frames_and_batched_caches(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    for sid in (4, 5, 6):
        att.allocate_stream(sid)
    step(att, 4)
    step(att, 4, 2)
    step(att, 6, 3)
    assert att.cached_frames([6, 4, 5]).tolist() == [3, 6, 0]
    assert att.cached_frames([6]).dtype == torch.int32
    att.prepare_chunks_batched([6, 4, 5])
    caches = att.get_batched_paged_caches([6, 4, 5])
    assert len(caches) == 2
    c = caches[1]
    assert c.block_table.tolist() == [row(att, 6), row(att, 4), row(att, 5)]
    assert c.cache_seqlens.tolist() == [3, 6, 0]
    assert c.host_seqlen == 6 and c.block_size == 4
    assert c.k_cache.data_ptr() == pool.get_kv_view(1)[0].data_ptr()
    assert c.v_cache.shape == (12, 4, 2, 4)
    bt, cs = att.get_paged_state_views(4)
    assert bt.shape == (1, 8) and cs.tolist() == [6]
    single = att.get_paged_caches(4)
    assert single[0].block_table.tolist() == [row(att, 4)] and single[0].host_seqlen == 6
    assert_drained(att, pool)


def test_state_views_follow_later_commits(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    att.prepare_chunk(1)
    bt, cs = att.get_paged_state_views(1)
    att.commit_chunk_paged(1, 4)
    att.prepare_chunk(1)
    att.get_paged_state_views(1)  # flushes
    assert cs.tolist() == [4] and bt[0, :2].tolist() == [0, 1]
    assert bt.data_ptr() == att.block_table.data_ptr()
    assert_drained(att, pool)


@pytest.mark.parametrize("reader", ["get_paged_caches", "get_paged_state_views"])
def test_paged_reads_need_prepare(make_config, reader):
    att, pool = build(make_config)
    att.allocate_stream(1)
    with pytest.raises(RuntimeError, match="prepare_chunk"):
        getattr(att, reader)(1)
    with pytest.raises(RuntimeError, match="prepare_chunk"):
        att.get_batched_paged_caches([1])
    att.prepare_chunk(1)
    getattr(att, reader)(1)
    att.reset_stream(1)
    with pytest.raises(RuntimeError, match="prepare_chunk"):
        getattr(att, reader)(1)


def test_commit_checks(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    with pytest.raises(RuntimeError, match="room for 0"):
        att.commit_chunk_paged(1, 4)
    att.prepare_chunk(1)
    with pytest.raises(ValueError, match=r"0\.\.4, got 5"):
        att.commit_chunk_paged(1, 5)
    att.commit_chunk_paged(1, 3)
    with pytest.raises(RuntimeError, match="committing 4 frames but its blocks have room for 1"):
        att.commit_chunk_paged(1, 4)


def test_duplicate_and_unknown_streams(make_config):
    att, pool = build(make_config)
    att.allocate_stream(1)
    with pytest.raises(ValueError, match="stream 1 is already allocated"):
        att.allocate_stream(1)
    att.free_stream(1)
    calls = [
        lambda: att.prepare_chunk(1),
        lambda: att.prepare_chunks_batched([1]),
        lambda: att.commit_chunk_paged(1, 4),
        lambda: att.commit(1, torch.zeros(2, 2, 4, 8)),
        lambda: att.get_stacked_cache(1),
        lambda: att.get_paged_caches(1),
        lambda: att.get_paged_state_views(1),
        lambda: att.get_batched_paged_caches([1]),
        lambda: att.cached_frames([1]),
        lambda: att.at_capacity(1),
        lambda: att.reset_stream(1),
        lambda: att.free_stream(1),
        lambda: att.stream_info(1),
    ]
    for call in calls:
        with pytest.raises(KeyError, match="stream 1 is not allocated"):
            call()


def test_slot_exhaustion_and_caller_slots(make_config):
    att, pool = build(make_config, pad_lanes=1, scratch=1)
    assert [att.allocate_stream(s) for s in (1, 2, 3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="all 3 slots are in use"):
        att.allocate_stream(4)
    assert 4 not in att
    att.free_stream(2)
    with pytest.raises(ValueError, match="slot 0 is already bound to stream 1"):
        att.allocate_stream(5, slot=0)
    with pytest.raises(ValueError, match="slot 3 out of range"):
        att.allocate_stream(5, slot=3)  # the pad lane
    assert att.allocate_stream(5, slot=1) == 1
    att.free_stream(5)
    assert att.allocate_stream(6) == 1  # the lowest unbound slot
    assert_drained(att, pool)


def test_reset_stream_frees_blocks_and_keeps_slot(make_config):
    att, pool = build(make_config, num_left_chunks=-1)
    att.allocate_stream(1)
    att.allocate_stream(2)
    for _ in range(3):
        step(att, 2)
    evictions = att.num_evictions
    att.reset_stream(2)
    assert att.slot_of(2) == 1
    assert att.num_cached_frames(2) == 0 and att.stream_info(2).num_total_frames == 0
    assert row(att, 2) == [0] * 8 and att.cache_seqlens[1].item() == 0
    assert pool.num_free_blocks == 12 and att.num_evictions == evictions
    step(att, 2)
    assert att.stream_info(2).block_ids == (3,)  # freed blocks went to the tail
    assert_drained(att, pool)


def test_rejects_mismatched_pool(make_config):
    pool = BlockPool(make_config(head_dim=8))
    with pytest.raises(ValueError, match="does not match"):
        AttentionCacheManager(pool, make_config())
    with pytest.raises(ValueError, match="pad_lanes"):
        AttentionCacheManager(BlockPool(make_config()), make_config(), pad_lanes=-1)
