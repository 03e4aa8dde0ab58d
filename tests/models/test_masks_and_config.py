"""Chunk masks, dynamic-chunk training, config validation."""

from __future__ import annotations

import pytest
import torch

from oasr.models import AsrModel, ConformerConfig
from oasr.models.masks import add_chunk_mask, pick_chunk_geometry, subsequent_chunk_mask


def _loop_mask(size: int, chunk: int, left: int) -> torch.Tensor:
    ret = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        start = 0 if left < 0 else max((i // chunk - left) * chunk, 0)
        ret[i, start : min((i // chunk + 1) * chunk, size)] = True
    return ret


@pytest.mark.parametrize(("size", "chunk", "left"), [(10, 3, -1), (37, 4, 2), (16, 16, 0), (5, 8, 1)])
def test_subsequent_chunk_mask_matches_definition(size, chunk, left):
    assert torch.equal(subsequent_chunk_mask(size, chunk, left), _loop_mask(size, chunk, left))


def test_padded_queries_with_no_visible_key_see_everything():
    masks = torch.tensor([[[True, True, False, False, False, False]]])  # (1, 1, 6)
    out = add_chunk_mask(masks, (2, 0))
    assert out[0, 4].all() and out[0, 5].all()
    assert out[0, 0].tolist() == [True, True, False, False, False, False]


def test_decoding_geometry():
    args = dict(use_dynamic_left_chunk=False, static_chunk_size=0, training=False)
    assert pick_chunk_geometry(50, True, decoding_chunk_size=16, num_decoding_left_chunks=4, **args) == (16, 4)
    assert pick_chunk_geometry(50, True, decoding_chunk_size=-1, num_decoding_left_chunks=4, **args) == (50, -1)
    assert pick_chunk_geometry(50, False, decoding_chunk_size=16, num_decoding_left_chunks=4, **args) is None
    static = dict(args, static_chunk_size=8)
    assert pick_chunk_geometry(50, False, decoding_chunk_size=0, num_decoding_left_chunks=-1, **static) == (8, -1)


def test_dynamic_chunk_training_draws_both_full_and_limited_chunks():
    torch.manual_seed(0)
    draws = [
        pick_chunk_geometry(100, True, True, 0, 0, -1, training=True, max_chunk_size=25)
        for _ in range(300)
    ]
    full = [d for d in draws if d == (100, -1)]
    limited = [d for d in draws if d != (100, -1)]
    assert 90 < len(full) < 210
    assert all(1 <= c <= 25 for c, _ in limited)
    assert {left for _, left in limited} - {-1}  # dynamic left chunks were drawn
    assert all(-1 <= left <= 99 for _, left in limited)


def test_training_forward_uses_a_chunk_mask_and_backprops():
    cfg = ConformerConfig(output_size=16, attention_heads=2, linear_units=32, num_blocks=2,
                          vocab_size=6, use_dynamic_chunk=True)
    model = AsrModel(cfg).train()
    torch.manual_seed(1)
    x, lens = torch.randn(2, 120, 80), torch.tensor([120, 90])
    enc, enc_lens = model(x, lens)
    assert enc.shape == (2, 29, 16) and enc_lens.tolist() == [29, 21]
    loss = model.ctc_loss(enc, enc_lens, torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2]))
    loss.backward()
    assert torch.isfinite(loss)
    assert model.encoder.encoders[0].self_attn.linear_pos.weight.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_layer": "conv2d8"}, "input_layer='conv2d8' is not supported"),
        ({"output_size": 30, "attention_heads": 4}, "not divisible by attention_heads"),
        ({"cnn_module_norm": "group_norm"}, "cnn_module_norm"),
        ({"pos_enc_layer_type": "abs_pos"}, "rel_pos"),
        ({"ctc_blank_id": 40, "vocab_size": 32}, "ctc_blank_id 40"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConformerConfig(**kwargs)


def test_config_streaming_geometry():
    cfg = ConformerConfig()
    assert cfg.chunk_window_frames(16) == 67 and cfg.chunk_stride_frames(16) == 64
    assert cfg.head_dim == 64 and cfg.cnn_cache_frames == 14
