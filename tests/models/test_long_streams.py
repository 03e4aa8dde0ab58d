"""Streams past WeNet's 5000-position table: the table grows and outputs stay exact."""

from __future__ import annotations

import math

import torch
from model_testutil import PagedHarness, chunk_windows, max_diff, run_forward_chunk

from oasr.models import AsrModel, ConformerConfig
from oasr.models.positional import RelPositionalEncoding


def test_table_grows_by_doubling_and_keeps_the_sinusoid():
    enc = RelPositionalEncoding(144, 0.0)
    head = enc.pe[:5000].clone()
    enc.ensure_positions(5001)
    assert enc.num_positions == 10000
    assert torch.equal(enc.pe[:5000], head)
    pos = torch.arange(9990, 10000, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, 144, 2, dtype=torch.float64) * -(math.log(10000.0) / 144))
    assert max_diff(enc.pe[9990:, 0::2], torch.sin(pos * div)) <= 2e-3
    assert max_diff(enc.pe[9990:, 1::2], torch.cos(pos * div)) <= 2e-3
    enc.ensure_positions(30001)
    assert enc.num_positions == 40000


def test_projected_table_is_not_in_the_state_dict(wenet_model: AsrModel):
    keys = wenet_model.state_dict().keys()
    assert not any("pos_enc.pe" in k or "pos_table" in k for k in keys)


def _tiny_model() -> AsrModel:
    torch.manual_seed(3)
    cfg = ConformerConfig(output_size=16, attention_heads=2, linear_units=24, num_blocks=2,
                          vocab_size=8, cnn_module_kernel=5, use_dynamic_chunk=True)
    model = AsrModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # livelier activations than the tiny default init
    return model


def test_two_streams_run_past_5000_frames_with_eviction():
    """A real stream goes 5200 encoder frames (325 chunks) and a second joins late; both equal
    dense chunk-by-chunk streaming with the same left context."""
    model = _tiny_model()
    g = torch.Generator().manual_seed(0)
    long_feats = torch.randn(325 * 64 + 3, 80, generator=g) * 3.0 + 10.0
    late_feats = long_feats[1000:2500].flip(0).clone()
    harness = PagedHarness(model, num_left_chunks=4, max_batch_size=2, max_num_blocks=12,
                           max_blocks_per_seq=6)
    win_long, win_late = chunk_windows(long_feats.size(0)), chunk_windows(late_feats.size(0))
    outs: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    harness.add(0)
    join_at = 300
    for i, (s, e) in enumerate(win_long):
        chunks = {0: long_feats[s:e]}
        if i == join_at:
            harness.add(1)
        if join_at <= i < join_at + len(win_late):
            ls, le = win_late[i - join_at]
            chunks[1] = late_feats[ls:le]
        for sid, y in harness.step(chunks).items():
            outs[sid].append(y)
    long_out = torch.cat(outs[0])
    assert long_out.size(0) == 5200 and harness.offsets[0] == 5200
    assert model.encoder.embed.pos_enc.num_positions == 10000
    assert harness.manager.num_cached_frames(0) == 64
    assert max_diff(long_out, run_forward_chunk(model, long_feats, 64)) <= 1e-4
    assert max_diff(torch.cat(outs[1]), run_forward_chunk(model, late_feats, 64)) <= 1e-5


def test_table_grown_in_inference_mode_still_trains():
    cfg = ConformerConfig(output_size=16, attention_heads=2, linear_units=24, num_blocks=1,
                          vocab_size=8, positional_dropout_rate=0.0)
    model = AsrModel(cfg)
    with torch.inference_mode():
        model.encoder.embed.pos_enc.ensure_positions(6000)
    model.train()
    enc, lens = model(torch.randn(1, 60, 80), torch.tensor([60]), -1)
    model.ctc_loss(enc, lens, torch.tensor([[1, 2]]), torch.tensor([2])).backward()
    assert model.encoder.encoders[0].self_attn.linear_pos.weight.grad is not None
