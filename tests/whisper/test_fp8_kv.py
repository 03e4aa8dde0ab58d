"""FP8 decoder K/V on a tiny random Whisper: fp8 paged == fp8 dense, close to full precision
(the format itself: tests/fmha/test_fp8.py)."""

from __future__ import annotations

import pytest
import torch
from whisper_testutil import TINY_SPEC, forced_logits, tiny_encoded, tiny_manager, tiny_model

from oasr.fmha.fp8 import FP8_DTYPE, quantize_fp8
from oasr.models.whisper import DecoderKv, greedy_decode


@pytest.mark.parametrize("reuse_cross", [True, False])
@torch.inference_mode()
def test_fp8_paged_equals_fp8_dense_and_stays_close_to_full_precision(reuse_cross: bool) -> None:
    model = tiny_model(seed=3)
    cross = model.decoder.cross_kv(tiny_encoded(3, seed=7))
    forced = torch.randint(0, 60, (3, 9), generator=torch.Generator().manual_seed(8))
    full = forced_logits(model, DecoderKv(cross, 16), forced)
    dense8 = forced_logits(model, DecoderKv(cross, 16, "fp8_e4m3"), forced)
    mgr = tiny_manager(max_num_blocks=40, block_size=4, fp8=True)
    assert mgr.pool.dtype == FP8_DTYPE and mgr.k_scales is not None
    for row in range(3):
        mgr.allocate_row(row, 16)
    mgr.build_cross_kv([0, 1, 2], cross)
    paged8 = forced_logits(model, mgr.view([0, 1, 2], reuse_cross=reuse_cross), forced)
    torch.testing.assert_close(paged8, dense8, rtol=1e-5, atol=1e-5)
    spread = full.std()
    assert (dense8 - full).abs().max() < 0.25 * spread, "fp8 K/V drifted far from fp32"
    assert not torch.equal(dense8, full), "fp8 storage should not be bit-exact"
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 40

    for row in range(3):
        mgr.allocate_row(row, 16)
    mgr.build_cross_kv([0, 1, 2], cross)
    view = mgr.view([0, 1, 2], reuse_cross=reuse_cross)
    paged_tokens = greedy_decode(model, TINY_SPEC, view, 3, max_new_tokens=14)
    dense_tokens = greedy_decode(model, TINY_SPEC, DecoderKv(cross, 16, "fp8_e4m3"), 3, 14)
    assert paged_tokens == dense_tokens
    for row in range(3):
        mgr.free_row(row)
    assert mgr.pool.num_free_blocks == 40 and mgr.num_reserved_blocks == 0


@torch.inference_mode()
def test_fp8_prefill_attends_fresh_then_reads_the_cache() -> None:
    """With cross K/V already exact in fp8, a prompt prefill into an empty fp8 cache gives
    bit-identical logits to full precision (its self-attention sees its own K/V in the served
    dtype); the next step reads the quantized prompt K/V and differs."""
    model = tiny_model(seed=4)
    exact = [(quantize_fp8(k).dequantize(), quantize_fp8(v).dequantize())
             for k, v in model.decoder.cross_kv(tiny_encoded(1, seed=9))]
    prompt = torch.tensor([TINY_SPEC.prompt])
    full, fp8 = DecoderKv(exact, 8), DecoderKv(exact, 8, "fp8_e4m3")
    torch.testing.assert_close(model.decoder(prompt, fp8), model.decoder(prompt, full), rtol=0, atol=0)
    step = torch.tensor([[5]])
    assert not torch.equal(model.decoder(step, fp8), model.decoder(step, full))
