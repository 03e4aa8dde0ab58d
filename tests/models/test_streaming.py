"""Chunk-by-chunk streaming (dense forward_chunk, paged, batched paged) against WeNet."""

from __future__ import annotations

import pytest
import torch
from model_testutil import (
    PagedHarness,
    chunk_windows,
    max_diff,
    run_forward_chunk,
    run_paged_alone,
)

from oasr.models import AsrModel

LEFT = {"leftall": (-1, -1), "left4": (4, 64)}  # name: (num_left_chunks, required_cache_size)


@pytest.mark.parametrize("name", ["leftall", "left4"])
def test_forward_chunk_matches_wenet(wenet_model: AsrModel, feats, reference, name):
    enc = run_forward_chunk(wenet_model, feats[0], LEFT[name][1])
    logp = wenet_model.ctc_log_probs(enc.unsqueeze(0))[0]
    assert max_diff(enc, reference[f"enc_chunked_chunk16_{name}"]) <= 1e-4
    assert max_diff(logp, reference[f"ctc_logp_chunked_chunk16_{name}"]) <= 1e-4


def test_forward_chunk_returns_wenet_caches(wenet_model: AsrModel, feats, reference):
    with torch.no_grad():
        y, att, cnn = wenet_model.encoder.forward_chunk(feats[:, :67], 0, 64)
        _, att1, cnn1 = wenet_model.encoder.forward_chunk(feats[:, 64:131], 16, 64, att, cnn)
    assert y.shape == (1, 16, 144)
    assert max_diff(att, reference["trace_left4_chunk0_att_cache"]) <= 1e-4
    assert max_diff(cnn, reference["trace_left4_chunk0_cnn_cache"]) <= 1e-4
    assert att1.shape == (4, 4, 32, 72) and cnn1.shape == (4, 1, 144, 14)


@pytest.mark.parametrize("name", ["leftall", "left4"])
def test_paged_single_stream_matches_wenet(wenet_model: AsrModel, feats, reference, name):
    enc = run_paged_alone(wenet_model, feats[0], LEFT[name][0])
    logp = wenet_model.ctc_log_probs(enc.unsqueeze(0))[0]
    assert max_diff(enc, reference[f"enc_chunked_chunk16_{name}"]) <= 1e-4
    assert max_diff(logp, reference[f"ctc_logp_chunked_chunk16_{name}"]) <= 1e-4


def _stream_sources(feats: torch.Tensor) -> dict[int, torch.Tensor]:
    """Four different utterances: the reference and three other lengths / contents."""
    g = torch.Generator().manual_seed(0)
    base = feats[0]
    return {
        0: base,
        1: base[37:337].clone(),
        2: base.flip(0)[:450] + 0.3 * torch.randn(450, 80, generator=g),
        3: base[100:303] * 0.9,
    }


def _run_batched(model, sources, num_left_chunks, starts) -> dict[int, torch.Tensor]:
    """Streams join at step ``starts[sid]``; each step runs every live stream in one call."""
    harness = PagedHarness(model, num_left_chunks)
    windows = {sid: chunk_windows(x.size(0)) for sid, x in sources.items()}
    outs: dict[int, list[torch.Tensor]] = {sid: [] for sid in sources}
    step, offsets_seen = 0, []
    while any(len(outs[s]) < len(windows[s]) for s in sources):
        live = [s for s in sources if starts[s] <= step and len(outs[s]) < len(windows[s])]
        for s in live:
            if not outs[s]:
                harness.add(s)
        chunks = {s: sources[s][slice(*windows[s][len(outs[s])])] for s in live}
        offsets_seen.append(sorted({harness.offsets[s] for s in live}))
        for s, y in harness.step(chunks).items():
            outs[s].append(y)
            if len(outs[s]) == len(windows[s]):
                harness.free(s)
        step += 1
    assert any(len(o) > 1 for o in offsets_seen), "streams never ran at different offsets"
    assert harness.pool.num_free_blocks == harness.cache_config.max_num_blocks
    return {s: torch.cat(o, dim=0) for s, o in outs.items()}


@pytest.mark.parametrize("name", ["leftall", "left4"])
def test_batched_paged_streams_match_wenet_and_one_by_one(wenet_model, feats, reference, name):
    left = LEFT[name][0]
    sources = _stream_sources(feats)
    batched = _run_batched(wenet_model, sources, left, starts={0: 0, 1: 1, 2: 2, 3: 4})
    assert max_diff(batched[0], reference[f"enc_chunked_chunk16_{name}"]) <= 1e-4
    logp = wenet_model.ctc_log_probs(batched[0].unsqueeze(0))[0]
    assert max_diff(logp, reference[f"ctc_logp_chunked_chunk16_{name}"]) <= 1e-4
    for sid, x in sources.items():
        alone = run_paged_alone(wenet_model, x, left)
        assert max_diff(batched[sid], alone) <= 1e-5
        with torch.no_grad():
            full, _ = wenet_model.encoder(x.unsqueeze(0), torch.tensor([x.size(0)]), 16, left)
        assert max_diff(batched[sid], full[0]) <= 1e-4


def test_paged_final_partial_chunk_keeps_conv_state_of_real_frames(wenet_model, feats):
    """A short row next to a full one: its conv state must come from its own last frames."""
    harness = PagedHarness(wenet_model, -1)
    harness.add(0)
    harness.add(1)
    harness.step({0: feats[0, :67], 1: feats[0, 64:131]})
    short = feats[0, 200:240]  # 40 frames -> 9 encoder frames
    out = harness.step({0: feats[0, 64:131], 1: short})
    assert out[1].shape == (9, 144)
    alone = PagedHarness(wenet_model, -1)
    alone.add(5)
    alone.step({5: feats[0, 64:131]})
    ref = alone.step({5: short})[5]
    assert max_diff(out[1], ref) <= 1e-5
    slot1, slot5 = harness.manager.slot_of(1), alone.manager.slot_of(5)
    assert max_diff(harness.cnn[:, slot1], alone.cnn[:, slot5]) <= 1e-5


def test_paged_with_sdpa_backend_matches_wenet(wenet_model, feats, reference, monkeypatch):
    monkeypatch.setenv("OASR_ATTN_BACKEND", "sdpa")
    enc = run_paged_alone(wenet_model, feats[0], 4)
    assert max_diff(enc, reference["enc_chunked_chunk16_left4"]) <= 1e-4


def test_empty_cnn_cache_placeholder_means_zeros(wenet_model, feats):
    harness = PagedHarness(wenet_model, -1)
    harness.add(0)
    caches_args = dict(xs=feats[:, :67], xs_lens=torch.tensor([67]),
                       offsets=torch.tensor([0]))
    harness.manager.prepare_chunks_batched([0])
    caches = harness.manager.get_batched_paged_caches([0])
    with torch.no_grad():
        ys_a, lens, cnn_a = wenet_model.encoder.forward_chunk_paged(
            att_caches=caches, cnn_cache=torch.zeros(0), **caches_args)
        ys_b, _, cnn_b = wenet_model.encoder.forward_chunk_paged(
            att_caches=caches, cnn_cache=torch.zeros(4, 1, 14, 144), **caches_args)
    assert lens.tolist() == [16] and cnn_a.shape == (4, 1, 14, 144)
    assert max_diff(ys_a, ys_b) == 0.0 and max_diff(cnn_a, cnn_b) == 0.0


def test_paged_rejects_wrong_cnn_cache_shape(wenet_model, feats):
    harness = PagedHarness(wenet_model, -1)
    harness.add(0)
    harness.manager.prepare_chunks_batched([0])
    caches = harness.manager.get_batched_paged_caches([0])
    with pytest.raises(ValueError, match=r"cnn_cache has shape \(4, 1, 144, 14\)"):
        wenet_model.encoder.forward_chunk_paged(
            feats[:, :67], torch.tensor([67]), torch.tensor([0]), caches, torch.zeros(4, 1, 144, 14)
        )


def test_bfloat16_model_streams_close_to_float32(wenet_model, feats):
    """dtype plumbing: a bf16 model with a bf16 pool runs every path (loose bound: bf16)."""
    model = AsrModel(wenet_model.config)
    model.load_state_dict(wenet_model.state_dict())
    model = model.to(torch.bfloat16).eval()
    assert model.encoder.embed.pos_enc.pe.dtype == torch.float32
    ref = run_forward_chunk(wenet_model, feats[0], -1)
    harness = PagedHarness(model, -1, max_batch_size=1, max_num_blocks=16, dtype=torch.bfloat16)
    harness.add(0)
    out = torch.cat([harness.step({0: feats[0, s:e]})[0] for s, e in chunk_windows(512)])
    assert out.dtype == torch.bfloat16
    assert max_diff(out, ref) < 0.25  # outputs reach |5|; bf16 keeps ~3 significant digits
    with torch.no_grad():
        full, _ = model.encoder(feats, torch.tensor([512]), 16, -1)
        logp = model.ctc_log_probs(full)
    assert logp.dtype == torch.float32 and max_diff(full[0], ref) < 0.25


def test_forward_chunk_refuses_batches_and_non_causal_models(wenet_model, feats):
    with pytest.raises(ValueError, match="one stream, got batch 2"):
        wenet_model.encoder.forward_chunk(feats[:, :67].expand(2, -1, -1), 0, -1)
    from oasr.models import ConformerConfig

    offline = AsrModel(ConformerConfig(output_size=16, attention_heads=2, linear_units=24,
                                       num_blocks=1, vocab_size=5, causal=False)).eval()
    with pytest.raises(ValueError, match="causal convolution module"):
        offline.encoder.forward_chunk(feats[:, :67], 0, -1)
