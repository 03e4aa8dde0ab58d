"""FP8 K/V format: power-of-two per-vector scales, one quantize-and-store per layer."""

from __future__ import annotations

import torch

from oasr.fmha.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    QuantizedKv,
    fp8_scales,
    quantize_fp8,
    quantize_kv_store,
)


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
