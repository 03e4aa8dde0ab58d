"""StreamContext (the reference API): lifecycle on tiny pools, and whole streams of the WeNet
reference model through the cache layer (dense, paged, and two batched streams at different
offsets)."""

import pytest
import torch
from cache_helpers import assert_drained, fbank_windows, managers

from oasr.cache import CacheConfig, StreamContext


def test_open_binds_one_slot_and_free_returns_everything(make_config):
    pool, att, cnn, ctc = managers(make_config())
    a = StreamContext.open(5, att, cnn, ctc, vocab_size=4)
    b = StreamContext.open(6, att, cnn, ctc, vocab_size=4)
    assert (a.slot, b.slot) == (0, 1) and cnn.slot_of(6) == 1
    b.prepare_chunk()
    b.commit_chunk_paged(4, torch.ones(2, 1, 2, 6))
    assert b.num_cached_frames == 4 and b.cached_frames().tolist() == [4]
    assert torch.all(cnn.buffer[:, 1] == 1) and not cnn.buffer[:, 0].any()
    b.reset()
    assert b.num_cached_frames == 0 and not b.get_cnn_cache().any() and b.slot == 1
    assert [c.get_decoder().state.pool_row for c in (a, b)] == [0, 1]  # decoder row == slot
    a.free()
    b.free()
    assert ctc.stream_ids == [] and cnn.stream_ids == []
    assert_drained(att, pool)


def test_open_rolls_back_on_failure(make_config):
    pool, att, cnn, ctc = managers(make_config())
    cnn.allocate_stream(5, 2)
    with pytest.raises(ValueError, match="stream 5 is already allocated"):
        StreamContext.open(5, att, cnn, ctc, vocab_size=4)
    assert 5 not in att and att.stream_ids == []
    with pytest.raises(ValueError, match="vocab_size"):
        StreamContext.open(7, att, cnn, ctc)
    ctx = StreamContext.open(7, att, cnn)  # no decoder
    with pytest.raises(RuntimeError, match="without a CTC manager"):
        ctx.get_decoder()


def test_dense_commit_through_context(make_config):
    pool, att, cnn, ctc = managers(make_config(num_left_chunks=1))
    ctx = StreamContext.open(1, att, cnn, ctc, vocab_size=4)
    kv = torch.randn(2, 2, 4, 8)
    ctx.commit_chunk(kv, torch.full((2, 1, 2, 6), 2.0))
    ctx.commit_chunk(kv * 2)
    assert torch.equal(ctx.get_att_cache(), kv * 2)
    assert torch.all(ctx.get_cnn_cache() == 2.0)
    with pytest.raises(ValueError, match="required_cache_size=-1"):
        ctx.commit_wenet_chunk(torch.zeros(2, 2, 3, 8), torch.zeros(2, 1, 6, 2), 4)


# ---------------------------------------------------------------- the WeNet reference model


def model_cache_config(left, max_batch_size=1):
    return CacheConfig(num_layers=4, n_kv_head=4, head_dim=36, hidden_dim=144, kernel_size=15,
                       chunk_size=16, num_left_chunks=left, block_size_frames=16,
                       max_num_blocks=16 * max_batch_size, max_blocks_per_seq=16,
                       max_batch_size=max_batch_size, device="cpu", dtype=torch.float32)


def open_reference_stream(left):
    """A stream of the reference model (vocabulary 32) in managers of its geometry."""
    pool, att, cnn, ctc = managers(model_cache_config(left))
    return pool, att, StreamContext.open(0, att, cnn, ctc, vocab_size=32)


def greedy(log_probs):
    ids = log_probs.argmax(-1).tolist()
    return [t for i, t in enumerate(ids) if t != 0 and (i == 0 or ids[i - 1] != t)]


@pytest.mark.parametrize("left", [4, -1])
@torch.no_grad()
def test_dense_context_reproduces_wenet_chunked(model, reference, left):
    pool, att, ctx = open_reference_stream(left)
    outputs, offset = [], 0
    for xs in fbank_windows(reference["feats"]):
        att_cache, cnn_cache = ctx.get_wenet_caches()
        ys, new_att, new_cnn = model.encoder.forward_chunk(xs, offset, -1, att_cache, cnn_cache)
        ctx.commit_wenet_chunk(new_att, new_cnn, ys.size(1))
        total = offset + ys.size(1)
        evicted_blocks = max(0, -(-total // 16) - 4) if left == 4 else 0
        assert ctx.num_cached_frames == total - 16 * evicted_blocks  # whole blocks, oldest first
        ctx.get_decoder().decode_chunk(model.ctc_log_probs(ys))
        outputs.append(ys[0])
        offset += ys.size(1)
    name = "left4" if left == 4 else "leftall"
    torch.testing.assert_close(torch.cat(outputs), reference[f"enc_chunked_chunk16_{name}"], atol=1e-4, rtol=1e-4)
    expected = greedy(reference[f"ctc_logp_chunked_chunk16_{name}"])
    assert ctx.get_decoder().finalize_stream()[0].tokens == expected
    ctx.free()
    assert_drained(att, pool)


@pytest.mark.parametrize("left", [4, -1])
@torch.no_grad()
def test_paged_context_reproduces_wenet_chunked(model, reference, left):
    pool, att, ctx = open_reference_stream(left)
    outputs, offset = [], 0
    for xs in fbank_windows(reference["feats"]):
        ctx.prepare_chunk()
        ys, ys_lens, new_cnn = model.encoder.forward_chunk_paged(
            xs, torch.tensor([xs.size(1)]), torch.tensor([offset]), ctx.get_att_caches(),
            ctx.get_cnn_cache(),
        )
        ctx.commit_chunk_paged(int(ys_lens[0]), new_cnn)
        outputs.append(ys[0])
        offset += ys.size(1)
    name = "left4" if left == 4 else "leftall"
    torch.testing.assert_close(torch.cat(outputs), reference[f"enc_chunked_chunk16_{name}"], atol=1e-4, rtol=1e-4)
    assert att.num_evictions == (4 if left == 4 else 0)  # 8 chunks, 4 kept
    ctx.free()
    assert_drained(att, pool)


@torch.no_grad()
def test_two_batched_streams_at_different_offsets(model, reference):
    """Stream B starts two chunks after A; every step is one padded batched call."""
    config = model_cache_config(4, max_batch_size=2)
    pool, att, cnn, ctc = managers(config, pad_lanes=1)
    chunks = fbank_windows(reference["feats"])[:7]  # full windows only
    a, b = StreamContext.open(10, att, cnn), StreamContext.open(11, att, cnn)
    outs = {10: [], 11: []}
    for step in range(len(chunks) + 2):
        live = [(10, step)] if step < len(chunks) else []
        if step >= 2:
            live.append((11, step - 2))
        sids = [sid for sid, _ in live]
        att.prepare_chunks_batched(sids)
        caches = att.get_batched_paged_caches(sids, pad_to=3)
        xs = torch.cat([chunks[i] for _, i in live] + [chunks[0]] * (3 - len(live)))
        offsets = torch.tensor([16 * i for _, i in live] + [0] * (3 - len(live)))
        ys, ys_lens, new_cnn = model.encoder.forward_chunk_paged(
            xs, torch.full((3,), 67), offsets, caches, cnn.gather(sids, pad_to=3)
        )
        cnn.scatter(sids, new_cnn, pad_to=3)
        for row, sid in enumerate(sids):
            att.commit_chunk_paged(sid, int(ys_lens[row]))
            outs[sid].append(ys[row])
    expected = reference["enc_chunked_chunk16_left4"][:112]
    for sid in (10, 11):
        torch.testing.assert_close(torch.cat(outs[sid]), expected, atol=1e-4, rtol=1e-4)
    assert att.stream_info(10).num_evictions == 3 and att.stream_info(11).num_evictions == 3
    a.free()
    b.free()
    assert_drained(att, pool)
