"""Autoregressive-decoder K/V: FP8 storage helpers, the paged decoder K/V manager and its view.

The decoder K/V is the second growing cache kind (seed §10): it grows one token per step and
never evicts, on its own ``BlockPool``. ``DecoderKVCacheManager`` hands each request a *row*
(two block-table rows: the self-attention K/V that grows, and the cross-attention K/V, a
fixed-extent region of ``cross_len`` frames written once by ``build_cross_kv``). Pages are
allocated as a row crosses a block boundary and all of a row's pages are freed when it
finishes; ``can_admit`` reserves each row's declared ceiling so a request never runs out of
pages half-answered. ``PagedDecoderKv`` is the per-step view a decoder forward reads through.

FP8 (``kv_cache="fp8_e4m3"``): data is ``float8_e4m3fn`` with one fp32 power-of-two scale per
(token, kv head), the least power of two that puts the vector's amax inside +-448.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
KV_CACHE_FORMATS = (None, "fp8_e4m3")
KV_STORAGES = ("auto", "paged", "dense")


def check_kv_cache_format(kv_cache: str | None) -> None:
    """Raise ``ValueError`` for a K/V format oasr cannot store."""
    if kv_cache not in KV_CACHE_FORMATS:
        raise ValueError(
            f"unknown decoder kv_cache format {kv_cache!r}: use None (the served dtype) or "
            "'fp8_e4m3'"
        )


def resolve_kv_storage(kv_storage: str, beam_size: int) -> str:
    """``auto`` -> ``paged`` for greedy decoding, ``dense`` for beam search.

    Beam search expands rows by repeated-index selects, which would alias two rows onto one
    page of the paged pool; it runs on dense per-group buffers instead.
    """
    if kv_storage not in KV_STORAGES:
        raise ValueError(f"kv_storage must be one of {KV_STORAGES}, got {kv_storage!r}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if kv_storage == "paged" and beam_size > 1:
        raise ValueError(
            f"kv_storage='paged' cannot run beam search (beam_size={beam_size}): a beam expand "
            "would alias rows onto shared pages; use kv_storage='dense' or 'auto'"
        )
    if kv_storage == "auto":
        return "paged" if beam_size == 1 else "dense"
    return kv_storage


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
    exponent = torch.ceil(torch.log2(amax / FP8_MAX))
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
