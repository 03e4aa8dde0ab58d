"""What a padded (or graph-captured) step asks of the attention cache by slots, not stream ids."""

import pytest
import torch

from oasr.cache import AttentionCacheManager, BlockPool


def test_max_cached_frames_needs_prepared_streams(make_config):
    config = make_config()
    att = AttentionCacheManager(BlockPool(config), config)
    att.allocate_stream(1)
    att.allocate_stream(2)
    with pytest.raises(RuntimeError, match="no prepared chunk"):
        att.max_cached_frames([1])
    att.prepare_chunks_batched([1, 2])
    att.commit_chunk_paged(1, 3)
    assert att.max_cached_frames([1, 2]) == 3 and att.max_cached_frames([2]) == 0


def test_caches_for_slots_equal_the_stream_id_path(make_config):
    config = make_config()
    att = AttentionCacheManager(BlockPool(config, scratch_blocks=1), config, pad_lanes=1)
    for sid in (1, 2):
        att.allocate_stream(sid)
    att.prepare_chunks_batched([2, 1])
    att.commit_chunk_paged(2, 2)
    att.prepare_chunks_batched([2, 1])
    by_ids = att.get_batched_paged_caches([2, 1], pad_to=3)
    slots = torch.tensor(att.batch_slot_list([2, 1], pad_to=3))
    att.flush_tables()
    by_slots = att.paged_caches_for_slots(slots, by_ids[0].host_seqlen)
    assert len(by_slots) == len(by_ids) == config.num_layers
    for a, b in zip(by_ids, by_slots, strict=True):
        assert torch.equal(a.block_table, b.block_table)
        assert torch.equal(a.cache_seqlens, b.cache_seqlens)
        assert a.host_seqlen == b.host_seqlen and a.k_cache.data_ptr() == b.k_cache.data_ptr()
