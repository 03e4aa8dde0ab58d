"""Random operation sequences against AttentionCacheManager: bookkeeping invariants, and the
K/V it holds is always the stream's most recent frames, in order."""

import torch
from cache_helpers import assert_drained, tiny_config
from hypothesis import example, given, settings
from hypothesis import strategies as st

from oasr.cache import AttentionCacheManager, BlockPool
from oasr.fmha import write_chunk_kv

STREAMS = (1, 2, 3)
op = st.one_of(
    st.tuples(st.just("open"), st.sampled_from(STREAMS)),
    st.tuples(st.just("close"), st.sampled_from(STREAMS)),
    st.tuples(st.just("reset"), st.sampled_from(STREAMS)),
    st.tuples(st.just("dense"), st.sampled_from(STREAMS), st.integers(1, 4)),
    st.tuples(st.just("paged"), st.sets(st.sampled_from(STREAMS), min_size=1), st.integers(1, 4)),
)


class Model:
    """The reference: each stream's full history of frame tags."""

    def __init__(self, att, pool):
        self.att, self.pool = att, pool
        self.history: dict[int, list[float]] = {}
        self.next_tag = 1.0

    def tags(self, n):
        out = [self.next_tag + i for i in range(n)]
        self.next_tag += n
        return out

    def open(self, sid):
        if sid not in self.history and self.att.num_streams < self.att.config.max_batch_size:
            self.att.allocate_stream(sid)
            self.history[sid] = [0.0] * self.att.config.prefill_frames

    def close(self, sid):
        if sid in self.history:
            self.att.free_stream(sid)
            del self.history[sid]

    def reset(self, sid):
        if sid in self.history:
            self.att.reset_stream(sid)
            self.history[sid] = [0.0] * self.att.config.prefill_frames

    def dense(self, sid, frames):
        if sid not in self.history or self.att.at_capacity(sid):
            return
        frames = min(frames, self.att.config.chunk_size)
        tags = self.tags(frames)
        kv = torch.tensor(tags).view(1, 1, frames, 1).expand(2, 2, frames, 8)
        self.att.commit(sid, kv)
        self.history[sid] += tags

    def paged(self, sids, frames):
        sids = sorted(s for s in sids if s in self.history and not self.att.at_capacity(s))
        if not sids:
            return
        chunk = self.att.config.chunk_size
        self.att.prepare_chunks_batched(sids)
        caches = self.att.get_batched_paged_caches(sids)
        rows = [self.tags(chunk) for _ in sids]
        k = torch.tensor(rows).view(len(sids), chunk, 1, 1).expand(-1, -1, 2, 4)
        for cache in caches:
            write_chunk_kv(cache, k, k)
        for sid, tags in zip(sids, rows, strict=True):
            used = min(frames, chunk)
            self.att.commit_chunk_paged(sid, used)
            self.history[sid] += tags[:used]

    def check(self):
        att, cfg = self.att, self.att.config
        owned = []
        for sid, hist in self.history.items():
            info = att.stream_info(sid)
            held = info.num_cached_frames
            owned += info.block_ids
            assert att.host_block_table_row(sid) == list(info.block_ids) + [0] * (
                cfg.max_blocks_per_seq - len(info.block_ids)
            )
            assert att.block_table[info.slot].tolist() == att.host_block_table_row(sid)
            # the device length is the frames the row spans: its history, after the frames
            # evicted from its first block (eviction by frame can start a history inside it)
            start = att.cache_seqlens[info.slot].item() - held
            assert 0 <= start < cfg.block_size_frames
            if held:  # the row's last spanned frame is the stream's newest
                last = start + held - 1
                keys = self.pool.get_kv_view(0)[0]
                block = info.block_ids[last // cfg.block_size_frames]
                assert keys[block, last % cfg.block_size_frames, 0, 0].item() == hist[-1]
            assert len(info.block_ids) * cfg.block_size_frames >= held
            if cfg.max_logical_blocks is not None:
                assert len(info.block_ids) <= cfg.max_logical_blocks + 1
            stacked = att.get_stacked_cache(sid)[0, 0, :, 0].tolist()
            assert stacked == hist[len(hist) - held :]
        assert len(owned) == len(set(owned))
        assert self.pool.num_free_blocks + len(owned) == self.pool.num_blocks
        assert all(b < self.pool.num_blocks for b in owned)


configs = st.sampled_from(
    [
        dict(num_left_chunks=-1),
        dict(num_left_chunks=2),
        dict(num_left_chunks=0),
        dict(num_left_chunks=1, prefill_kv_window=True),
        dict(chunk_size=3, num_left_chunks=2),
        dict(chunk_size=2, num_left_chunks=-1),
        dict(num_left_chunks=3, prefill_kv_window=True),  # 3 slots x (3 + 1) = all 12
    ]
)


@settings(max_examples=60, deadline=None)
@given(overrides=configs, ops=st.lists(op, max_size=30))
# a history that begins inside its first block (3-frame chunks in 4-frame blocks, evicted)
@example(overrides=dict(chunk_size=3, num_left_chunks=2),
         ops=[("open", 1), ("dense", 1, 1), ("dense", 1, 3), ("dense", 1, 3)])
def test_random_operations_keep_invariants(overrides, ops):
    cfg = tiny_config(**overrides)
    pool = BlockPool(cfg, scratch_blocks=1)
    att = AttentionCacheManager(pool, cfg, pad_lanes=1)
    model = Model(att, pool)
    for name, *args in ops:
        getattr(model, name)(*args)
        model.check()
    assert att.block_table[3].tolist() == [12] * cfg.max_blocks_per_seq
    assert_drained(att, pool)
