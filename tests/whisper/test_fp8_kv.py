"""FP8 decoder K/V: power-of-two per-vector scales, one quantize-and-store per layer, and fp8
paged == fp8 dense on a tiny random Whisper (close to full precision)."""

from __future__ import annotations

import pytest
import torch
from whisper_testutil import TINY_SPEC, forced_logits, tiny_encoded, tiny_manager, tiny_model

from oasr.fmha.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    QuantizedKv,
    fp8_scales,
    quantize_fp8,
    quantize_kv_store,
)
from oasr.models.whisper import DecoderKv, greedy_decode


def test_scales_are_the_least_power_of_two_fitting_448() -> None:
    x = torch.randn(5, 3, 16) * torch.logspace(-3, 3, 5).view(5, 1, 1)
    x[0, 0] = 0.0
    scales = fp8_scales(x)  # (5, 3)
    exponents = torch.log2(scales)
    assert torch.equal(exponents, exponents.round())
    amax = x.abs().amax(-1)
    live = amax > 0
    assert torch.all(amax[live] / scales[live] <= FP8_MAX)
    assert torch.all(amax[live] / (scales[live] / 2) > FP8_MAX)  # half the scale overflows
    assert scales[0, 0] == 1.0
    tiny = quantize_fp8(torch.full((1, 4), 1e-42))  # subnormal amax: the scale stays finite
    assert tiny.scales.item() == 2.0**-126 and torch.all(torch.isfinite(tiny.dequantize()))


def test_quantize_roundtrip_error_and_batch_invariance() -> None:
    x = torch.randn(4, 6, 64) * 3
    q = quantize_fp8(x)
    assert q.data.dtype == FP8_DTYPE and q.scales.dtype == torch.float32
    err = (q.dequantize() - x).abs()
    assert torch.all(err <= x.abs() / 16 + q.scales.unsqueeze(-1) * 2.0**-9)
    alone = quantize_fp8(x[2:3])
    assert torch.equal(alone.data.view(torch.uint8), q.data[2:3].view(torch.uint8))
    assert torch.equal(alone.scales, q.scales[2:3])


def test_quantize_kv_store_writes_only_its_slots() -> None:
    data = torch.zeros(10, 2, 8, dtype=FP8_DTYPE)
    k_store = QuantizedKv(data, torch.zeros(10, 2))
    v_store = QuantizedKv(torch.zeros(10, 2, 8, dtype=FP8_DTYPE), torch.zeros(10, 2))
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([7, 1, 4])
    quantize_kv_store(k, v, k_store, v_store, slots)
    torch.testing.assert_close(k_store.dequantize()[slots], quantize_fp8(k).dequantize())
    torch.testing.assert_close(v_store.dequantize()[slots], quantize_fp8(v).dequantize())
    untouched = [0, 2, 3, 5, 6, 8, 9]
    assert torch.all(k_store.scales[untouched] == 0) and torch.all(k_store.dequantize()[untouched] == 0)


@pytest.mark.parametrize("reuse_cross", [True, False])
@torch.inference_mode()
def test_fp8_paged_equals_fp8_dense_and_stays_close_to_full_precision(reuse_cross: bool) -> None:
    model = tiny_model(seed=3)
    cross = model.decoder.cross_kv(tiny_encoded(3, seed=7))
    forced = torch.randint(0, 60, (3, 9), generator=torch.Generator().manual_seed(8))
    full = forced_logits(model, DecoderKv(cross, 16), forced)
    dense8 = forced_logits(model, DecoderKv(cross, 16, "fp8_e4m3"), forced)
    mgr = tiny_manager(max_num_blocks=40, block_size=4, fp8=True)
    assert mgr.pool.k_pool.dtype == FP8_DTYPE and mgr.k_scales is not None
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
