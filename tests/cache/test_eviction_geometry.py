"""History is exactly the last ``num_left_chunks`` chunks at every geometry (issue #49,
item 2): chunks smaller than a block, equal to it, larger than it and straddling
block edges. The paged stream of the WeNet reference model, eviction by frame, equals WeNet's
dense chunked forward keeping ``required_cache_size = chunk * num_left_chunks`` frames, chunk
by chunk, K/V history included."""

import pytest
import torch
from cache_helpers import assert_drained, fbank_windows

from oasr.cache import AttentionCacheManager, BlockPool, CacheConfig

CHUNK = 16


def _config(block: int, left: int) -> CacheConfig:
    return CacheConfig(num_layers=4, n_kv_head=4, head_dim=36, hidden_dim=144, kernel_size=15,
                       chunk_size=CHUNK, num_left_chunks=left, block_size_frames=block,
                       max_num_blocks=64, max_blocks_per_seq=64, max_batch_size=1,
                       device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("block", [8, 12, 16, 24, 32, 64])  # chunk >, >, =, <, <, < block
@pytest.mark.parametrize("left", [1, 3])
@torch.no_grad()
def test_paged_eviction_equals_the_dense_reference(model, reference, block, left):
    cfg = _config(block, left)
    pool = BlockPool(cfg)
    att = AttentionCacheManager(pool, cfg)
    att.allocate_stream(0)
    window = CHUNK * left
    cnn = torch.zeros(0)
    dense_att = dense_cnn = None
    offset = 0
    starts = set()
    for xs in fbank_windows(reference["feats"]):
        att.prepare_chunk(0)
        assert len(att.stream_info(0).block_ids) <= cfg.peak_blocks_per_stream
        ys, lens, cnn = model.encoder.forward_chunk_paged(
            xs, torch.tensor([xs.size(1)]), torch.tensor([offset]), att.get_paged_caches(0), cnn)
        frames = int(lens[0])
        att.commit_chunk_paged(0, frames)
        dense, dense_att, dense_cnn = model.encoder.forward_chunk(
            xs, offset, window, dense_att, dense_cnn)
        torch.testing.assert_close(ys, dense, atol=1e-5, rtol=1e-5)
        offset += frames
        if frames == CHUNK:  # a full chunk: exactly the last `left` chunks are held
            assert att.num_cached_frames(0) == min(offset, window)
            torch.testing.assert_close(att.get_stacked_cache(0), dense_att, atol=1e-5, rtol=1e-5)
        starts.add(att.cache_starts[0].item())
        assert len(att.stream_info(0).block_ids) <= cfg.max_logical_blocks
    assert offset > 4 * CHUNK  # the stream evicted for several chunks
    if CHUNK % block:  # chunks end inside blocks: the history began inside its first block
        assert max(starts) > 0
    else:
        assert starts == {0}
    assert_drained(att, pool)
