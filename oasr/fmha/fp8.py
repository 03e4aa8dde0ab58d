"""FP8 K/V storage: ``float8_e4m3fn`` vectors with one fp32 power-of-two scale each.

The format the decoder K/V caches store with ``kv_cache="fp8_e4m3"`` (paged in the cache
layer's pool, dense in ``oasr.models.whisper.dense_kv``): a vector's scale is the least power
of two that puts its amax inside +-448, computed from that vector alone (no calibration, so
the result does not depend on the batch). It lives beside the attention that reads it: the
paged read dequantizes the pages it gathers, never the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
FP32_MIN_EXPONENT = -126  # keeps a scale of near-zero vectors a normal (non-zero) float32
KV_CACHE_FORMATS = (None, "fp8_e4m3")


def check_kv_cache_format(kv_cache: str | None) -> None:
    """Raise ``ValueError`` for a K/V format oasr cannot store."""
    if kv_cache not in KV_CACHE_FORMATS:
        raise ValueError(
            f"unknown decoder kv_cache format {kv_cache!r}: use None (the served dtype) or "
            "'fp8_e4m3'"
        )


@dataclass
class QuantizedKv:
    """FP8 vectors with their scales: ``data`` (..., D) float8_e4m3fn, ``scales`` (...) fp32.

    The value of a vector is ``data.float() * scales[..., None]``.
    """

    data: torch.Tensor
    scales: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(..., D) in ``dtype``."""
        return (self.data.float() * self.scales.unsqueeze(-1)).to(dtype)


def fp8_scales(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (...) fp32: the least power of two s with amax(|x|) / s <= 448 (1 for zeros)."""
    amax = x.detach().abs().amax(dim=-1).float()
    exponent = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(min=FP32_MIN_EXPONENT)
    scales = torch.exp2(exponent)
    return torch.where(amax > 0, scales, torch.ones_like(scales))


def quantize_fp8(x: torch.Tensor) -> QuantizedKv:
    """(..., D) float -> QuantizedKv with per-vector power-of-two scales (batch-invariant)."""
    scales = fp8_scales(x)
    data = (x.float() / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedKv(data, scales)


def quantize_kv_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: QuantizedKv,
    v_store: QuantizedKv,
    slots: torch.Tensor,
) -> None:
    """Quantize one layer's new K and V and scatter them to flat slots of the stores.

    Args:
        k, v: (N, H, D) new vectors, one per flat slot.
        k_store, v_store: data (num_slots, H, D) fp8 and scales (num_slots, H) fp32; views of
            the persistent storage (a pool layer flattened over blocks x page).
        slots: (N,) int64 destination slots.
    """
    for new, store in ((k, k_store), (v, v_store)):
        quantized = quantize_fp8(new)
        store.data.view(torch.uint8).index_copy_(0, slots, quantized.data.view(torch.uint8))
        store.scales.index_copy_(0, slots, quantized.scales)
