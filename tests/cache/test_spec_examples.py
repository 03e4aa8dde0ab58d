"""The cache specification's usage examples (docs/architecture.md), run as written against the WeNet
reference model, and compared with WeNet's own chunk-by-chunk outputs.

Each example's body is the specification's code; what it leaves to the reader is supplied
around it: ``model`` (the fixture loaded into an oasr ``AsrModel``), ``audio_chunks`` (the fbank
windows the feature extractor produces: 67 frames, stride 64), ``offset = 0``, and the
CacheConfig geometry of this model (4 layers of 4 heads x 36, width 144) in place of the
example's 12 x 4 x 64 one. ``dtype`` defaults to the specification's bfloat16 pool in one run
and float32 (the reference's precision) in the other.
"""

from dataclasses import dataclass

import pytest
import torch
from cache_helpers import fbank_windows

from oasr import GpuDecoderConfig, GpuStreamingDecoder
from oasr.cache import (
    AttentionCacheManager,
    BlockPool,
    CacheConfig,
    CnnCacheManager,
    CtcStateCacheManager,
    StreamContext,
)
from oasr.fmha import PagedKVCache

VOCAB = 32  # the fixture's output_dim (the examples' 5000 is a BPE model's; 7.1 reads the model's)


def make_config(num_left_chunks, dtype):
    return CacheConfig(num_layers=4, n_kv_head=4, head_dim=36, hidden_dim=144,
                       kernel_size=15, chunk_size=16, num_left_chunks=num_left_chunks,
                       block_size_frames=16, max_num_blocks=2048, device="cpu", dtype=dtype)


def beam_tokens(log_probs, beam_size):
    """What a fresh GpuStreamingDecoder makes of a whole (T, V) log-prob matrix."""
    decoder = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam_size), device="cpu")
    state = decoder.create_state(1, log_probs.size(-1))
    decoder.decode_chunk(log_probs[None], state)
    return decoder.finalize_stream(state)[0].tokens


# Tolerances: a float32 pool reproduces WeNet to float32 rounding; a bfloat16 pool rounds every
# stored K/V and conv frame (8 mantissa bits): 1.8e-3 measured on this model.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def example_7_1(model, audio_chunks, cfg):
    """§7.1, full streaming loop (paged mode)."""
    pool    = BlockPool(cfg)  # noqa: E221
    att_mgr = AttentionCacheManager(pool, cfg)
    cnn_mgr = CnnCacheManager(cfg)  # noqa: E221
    ctc_mgr = CtcStateCacheManager(GpuDecoderConfig(beam_size=10))  # noqa: E221

    sid = 42
    att_mgr.allocate_stream(sid)
    cnn_mgr.allocate_stream(sid)
    ctc_mgr.allocate_stream(sid, batch=1, vocab_size=model.config.vocab_size)
    ctx = StreamContext(sid, att_mgr, cnn_mgr, ctc_mgr)

    offset, outputs, held = 0, [], []
    for chunk in audio_chunks:                    # produced by feature extractor
        ctx.prepare_chunk()
        att_caches = ctx.get_att_caches()         # List[PagedKVCache]
        cnn_cache  = ctx.get_cnn_cache()  # noqa: E221
        # cache_t1 is the history the stream *holds*, not its offset: with
        # num_left_chunks=4 the offset grows forever while the cache does not.
        log_probs, new_cnn = model.forward_chunk_paged(
            chunk, offset, att_caches, cnn_cache,
            cache_t1=att_mgr.cached_frames([sid]))
        ctx.commit_chunk_paged(log_probs.size(1), new_cnn)
        ctx.get_decoder().decode_chunk(log_probs)
        offset += log_probs.size(1)
        outputs.append(log_probs[0])
        held.append(ctx.num_cached_frames)

    result = ctx.get_decoder().finalize_stream()
    ctx.free()
    assert pool.num_free_blocks == cfg.max_num_blocks and att_mgr.num_streams == 0
    return torch.cat(outputs), result, held


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("left", [4, -1])
@torch.no_grad()
def test_7_1_paged_loop_matches_wenet_chunked(model, reference, left, dtype):
    cfg = make_config(left, dtype)
    log_probs, result, held = example_7_1(model, fbank_windows(reference["feats"]), cfg)
    name = "left4" if left == 4 else "leftall"
    expected = reference[f"ctc_logp_chunked_chunk16_{name}"]
    torch.testing.assert_close(log_probs, expected, atol=TOLERANCE[dtype], rtol=0)
    assert result[0].tokens == beam_tokens(expected, beam_size=10)
    # held history after each chunk: all of it, or what is left in the newest 4 blocks
    totals = [min(16 * (i + 1), 127) for i in range(len(held))]
    evicted = [0 if left == -1 else max(0, -(-t // 16) - 4) for t in totals]
    assert held == [t - 16 * e for t, e in zip(totals, evicted, strict=True)]
    assert held[-1] == (127 if left == -1 else 63)


@pytest.mark.parametrize("left", [4, -1])
@torch.no_grad()
def test_7_2_dense_loop_matches_wenet_chunked(model, reference, left):
    cfg = make_config(left, torch.float32)
    pool = BlockPool(cfg)
    att_mgr = AttentionCacheManager(pool, cfg)
    cnn_mgr = CnnCacheManager(cfg)
    ctc_mgr = CtcStateCacheManager(GpuDecoderConfig(beam_size=10))
    sid, chunk_size = 7, 16
    required_cache_size = 16 * left if left > 0 else -1
    att_mgr.allocate_stream(sid)
    cnn_mgr.allocate_stream(sid)
    ctc_mgr.allocate_stream(sid, 1, VOCAB)  # positional, as §4.5 writes it
    offset, outputs = 0, []

    ctx = StreamContext(sid, att_mgr, cnn_mgr, ctc_mgr)

    for chunk in fbank_windows(reference["feats"]):
        att_cache = ctx.get_att_cache()
        cnn_cache = ctx.get_cnn_cache()
        log_probs, new_att, new_cnn = model.forward_chunk(
            chunk, offset, required_cache_size, att_cache, cnn_cache)
        new_kv_chunk = new_att[:, :, -chunk_size:, :]
        ctx.commit_chunk(new_kv_chunk, new_cnn)
        ctx.get_decoder().decode_chunk(log_probs)
        offset += log_probs.size(1)
        outputs.append(log_probs[0])

    name = "left4" if left == 4 else "leftall"
    expected = reference[f"ctc_logp_chunked_chunk16_{name}"]
    torch.testing.assert_close(torch.cat(outputs), expected, atol=1e-4, rtol=0)
    assert ctx.get_decoder().finalize_stream()[0].tokens == beam_tokens(expected, beam_size=10)
    ctx.free()


@dataclass
class Req:
    """What §7.3 reads off each request of a group."""

    stream_id: int
    stream_context: StreamContext


@torch.no_grad()
def test_7_3_batched_forward_matches_one_by_one(model, reference):
    cfg = make_config(4, torch.float32)
    pool = BlockPool(cfg)
    att_mgr = AttentionCacheManager(pool, cfg)
    cnn_mgr = CnnCacheManager(cfg)
    ctc_mgr = CtcStateCacheManager(GpuDecoderConfig(beam_size=10))
    feats = {3: reference["feats"], 9: reference["feats"].flip(0) * 0.9}
    group = []
    for sid in feats:
        att_mgr.allocate_stream(sid)
        cnn_mgr.allocate_stream(sid)
        ctc_mgr.allocate_stream(sid, 1, VOCAB)
        group.append(Req(sid, StreamContext(sid, att_mgr, cnn_mgr, ctc_mgr)))
    chunks = {sid: fbank_windows(f) for sid, f in feats.items()}
    offset, outputs = 0, {sid: [] for sid in feats}
    for step in range(len(chunks[3])):
        xs_stacked = torch.cat([chunks[req.stream_id][step] for req in group])
        cnn_stacked = (torch.zeros(0, 0, 0, 0) if step == 0  # §8's first-chunk placeholder
                       else torch.cat([req.stream_context.get_cnn_cache() for req in group], 1))

        # All B streams share an offset and have a full window ready.
        att_mgr.prepare_chunks_batched([req.stream_id for req in group])

        block_tables, cache_seqlens = [], []
        for req in group:
            bt, cs = req.stream_context.get_paged_state_views()
            block_tables.append(bt); cache_seqlens.append(cs)  # noqa: E702

        batched_bt = torch.cat(block_tables, dim=0)
        batched_cs = torch.cat(cache_seqlens, dim=0)

        batched_caches = [PagedKVCache(
            k_cache=pool.get_kv_view(l)[0],
            v_cache=pool.get_kv_view(l)[1],
            block_table=batched_bt, cache_seqlens=batched_cs,
            block_size=cfg.block_size_frames, host_seqlen=offset)
            for l in range(cfg.num_layers)]  # noqa: E741

        log_probs, new_cnn = model.forward_chunk_paged(
            xs_stacked, offset, batched_caches, cnn_stacked,
            cache_t1=att_mgr.cached_frames([req.stream_id for req in group]))

        for b, req in enumerate(group):
            req.stream_context.commit_chunk_paged(log_probs.size(1), new_cnn[:, b : b + 1])
            req.stream_context.get_decoder().decode_chunk(log_probs[b : b + 1])
            outputs[req.stream_id].append(log_probs[b])
        offset += log_probs.size(1)

    expected = reference["ctc_logp_chunked_chunk16_left4"]
    torch.testing.assert_close(torch.cat(outputs[3]), expected, atol=1e-4, rtol=0)
    alone, result, _ = example_7_1(model, chunks[9], cfg)
    torch.testing.assert_close(torch.cat(outputs[9]), alone, atol=1e-5, rtol=0)
    assert group[1].stream_context.get_decoder().finalize_stream()[0].tokens == result[0].tokens
    for req in group:
        req.stream_context.free()
    assert pool.num_free_blocks == cfg.max_num_blocks


@torch.no_grad()
def test_cache_t1_is_what_positions_the_keys(model, reference):
    """A wrong held length moves every key's relative position, so the output changes: the
    argument is read, not decorative."""
    cfg = make_config(4, torch.float32)
    pool = BlockPool(cfg)
    att_mgr = AttentionCacheManager(pool, cfg)
    cnn_mgr = CnnCacheManager(cfg)
    ctx = StreamContext.open(1, att_mgr, cnn_mgr)
    chunks = fbank_windows(reference["feats"])
    offset = 0
    for chunk in chunks[:2]:
        ctx.prepare_chunk()
        log_probs, new_cnn = model.forward_chunk_paged(
            chunk, offset, ctx.get_att_caches(), ctx.get_cnn_cache(), cache_t1=ctx.cached_frames())
        ctx.commit_chunk_paged(log_probs.size(1), new_cnn)
        offset += log_probs.size(1)
    ctx.prepare_chunk()
    args = (chunks[2], offset, ctx.get_att_caches(), ctx.get_cnn_cache())
    right = model.forward_chunk_paged(*args, cache_t1=ctx.cached_frames())[0]
    default = model.forward_chunk_paged(*args)[0]
    wrong = model.forward_chunk_paged(*args, cache_t1=ctx.cached_frames() - 8)[0]
    torch.testing.assert_close(right, default, atol=0, rtol=0)
    torch.testing.assert_close(right[0], reference["ctc_logp_chunked_chunk16_left4"][32:48],
                               atol=1e-4, rtol=0)
    assert (right - wrong).abs().max() > 1e-3
    with pytest.raises(ValueError, match="cache_t1 has shape"):
        model.forward_chunk_paged(*args, cache_t1=torch.zeros(2, dtype=torch.int32))


@torch.no_grad()
def test_entry_points_take_the_empty_placeholder_and_refuse_wenet_layout(model, reference):
    chunk = fbank_windows(reference["feats"])[0]
    empty = torch.zeros(0, 0, 0, 0)
    zeros = torch.zeros(4, 1, 14, 144)
    a, att, cnn = model.forward_chunk(chunk, 0, -1, empty, empty)
    b, _, _ = model.forward_chunk(chunk, 0, -1, None, zeros)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert tuple(cnn.shape) == (4, 1, 14, 144) and tuple(att.shape) == (4, 4, 16, 72)
    # the returned conv cache is WeNet's first-chunk trace, transposed into the cache layout
    torch.testing.assert_close(cnn, reference["trace_left4_chunk0_cnn_cache"].transpose(2, 3),
                               atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"expected \(4, 1, 14, 144\)"):
        model.forward_chunk(chunk, 0, -1, None, zeros.transpose(2, 3))


VARIANTS = {
    "batch_norm": dict(cnn_module_norm="batch_norm"),
    "post_norm": dict(normalize_before=False),
    "no_macaron_no_conv": dict(macaron_style=False, use_cnn_module=False),
    "relu_no_qkv_bias": dict(activation_type="relu", query_bias=False, key_bias=False),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@torch.no_grad()
def test_7_1_and_7_2_run_on_other_conformers(name):
    """Any Conformer oasr loads: random models of other configurations run the paged loop and
    the dense loop as written, and both equal the chunk-masked full-utterance forward."""
    from oasr.models import AsrModel, ConformerConfig

    torch.manual_seed(7)
    config = ConformerConfig(output_size=32, attention_heads=4, linear_units=48, num_blocks=2,
                             vocab_size=10, cnn_module_kernel=7, use_dynamic_chunk=True,
                             **VARIANTS[name])
    model = AsrModel(config).eval()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    feats = torch.randn(300, 80, generator=torch.Generator().manual_seed(1)) * 2.0 + 8.0
    enc, _ = model(feats[None], torch.tensor([300]), 16, 2)
    expected = model.ctc_log_probs(enc)[0]  # (74, 10)
    cfg = CacheConfig(num_layers=2, n_kv_head=4, head_dim=8, hidden_dim=32, kernel_size=7,
                      chunk_size=16, num_left_chunks=2, block_size_frames=16,
                      max_num_blocks=2048, device="cpu", dtype=torch.float32)
    paged, _, _ = example_7_1(model, fbank_windows(feats), cfg)
    torch.testing.assert_close(paged, expected, atol=1e-4, rtol=0)

    att_mgr = AttentionCacheManager(BlockPool(cfg), cfg)
    cnn_mgr = CnnCacheManager(cfg)
    ctx = StreamContext.open(1, att_mgr, cnn_mgr)
    offset, outputs, chunk_size, required_cache_size = 0, [], 16, 32
    for chunk in fbank_windows(feats):
        att_cache = ctx.get_att_cache()
        cnn_cache = ctx.get_cnn_cache()
        log_probs, new_att, new_cnn = model.forward_chunk(
            chunk, offset, required_cache_size, att_cache, cnn_cache)
        new_kv_chunk = new_att[:, :, -chunk_size:, :]
        ctx.commit_chunk(new_kv_chunk, new_cnn)
        offset += log_probs.size(1)
        outputs.append(log_probs[0])
    torch.testing.assert_close(torch.cat(outputs), expected, atol=1e-4, rtol=0)
    ctx.free()
