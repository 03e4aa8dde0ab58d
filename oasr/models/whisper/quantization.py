"""Decoder K/V quantization policy: the ``quantization`` options a server accepts, and the
refusals (by name, at construction) of a format that cannot be served."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch

from oasr.fmha import ATTN_BACKEND_ENV
from oasr.fmha.fp8 import FP8_DTYPE, check_kv_cache_format

FP8_TILE = 16  # the fp8 gather reads head dims in 16-wide tiles
FP8_MAX_HEAD_DIM = 256
FP8_REFUSED_BACKENDS = ("cute", "sdpa")
FP8_SCALE_BYTES = 4  # one fp32 scale per (token, kv head), for K and for V


def decoder_kv_bytes_per_token(num_layers: int, n_kv_head: int, head_dim: int,
                               dtype: torch.dtype, kv_cache: str | None) -> int:
    """Bytes one token's decoder K and V take across all layers:
    ``2 * layers * H_kv * (D + 4)`` stored as fp8 (1-byte data, an fp32 scale per vector),
    ``2 * layers * H_kv * D * element size`` in the served ``dtype`` (1.88x more at D = 64 in
    float16, 3.76x in float32).

    Raises:
        ValueError: an unknown ``kv_cache`` format.
    """
    check_kv_cache_format(kv_cache)
    if kv_cache == "fp8_e4m3":
        return 2 * num_layers * n_kv_head * (head_dim + FP8_SCALE_BYTES)
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * n_kv_head * head_dim * element


def device_stores_fp8(device: torch.device) -> bool:
    """Whether this torch build can cast to float8_e4m3fn and move its bytes on ``device``
    (what the fp8 store needs; on CPU the attention then dequantizes after the gather)."""
    try:
        torch.ones(2, device=device).to(FP8_DTYPE).view(torch.uint8).index_copy_(
            0, torch.zeros(1, dtype=torch.long, device=device),
            torch.zeros(1, dtype=torch.uint8, device=device))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def parse_quantization_options(options: Sequence[str]) -> dict[str, str]:
    """``["kv_cache=fp8_e4m3"]`` (the ``--quantization-option`` values) -> ``{"kv_cache": ...}``.

    Raises:
        ValueError: an option without ``=``, an unknown key, or a key given twice.
    """
    out: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"quantization option {option!r} is not KEY=VALUE")
        if key != "kv_cache":
            raise ValueError(f"unknown quantization option {key!r}: the only one is kv_cache")
        if key in out:
            raise ValueError(f"quantization option {key!r} given twice")
        out[key] = value
    kv_cache_format(out)
    return out


def kv_cache_format(quantization: Mapping[str, str] | None) -> str | None:
    """The decoder K/V format a ``quantization`` mapping asks for (None: the served dtype)."""
    if not quantization:
        return None
    unknown = sorted(set(quantization) - {"kv_cache"})
    if unknown:
        raise ValueError(f"unknown quantization keys {unknown}: the only one is 'kv_cache'")
    kv_cache = quantization.get("kv_cache")
    check_kv_cache_format(kv_cache)
    return kv_cache


def check_kv_cache_servable(
    kv_cache: str | None,
    *,
    kv_cache_dtypes: Sequence[str] | None,
    model_dtype: torch.dtype,
    device: torch.device,
    head_dim: int,
    attn_backend: str | None = None,
) -> None:
    """Refuse, by name, a K/V format that cannot be served (checked at construction).

    Args:
        kv_cache: the asked format (None always passes).
        kv_cache_dtypes: formats the decoder lists; None for a decode family with no AR cache.
        model_dtype, device: what the model runs in.
        head_dim: the decoder's per-head dimension.
        attn_backend: the attention backend (default ``$OASR_ATTN_BACKEND``, else ``torch``).
    Raises:
        ValueError: with the reason and what to change.
    """
    check_kv_cache_format(kv_cache)
    if kv_cache is None:
        return
    if kv_cache_dtypes is None:
        raise ValueError(f"kv_cache={kv_cache} needs an autoregressive decoder; this model's "
                         "decode family (CTC) has no decoder K/V cache")
    if kv_cache not in kv_cache_dtypes:
        raise ValueError(f"the decoder does not list kv_cache={kv_cache} (it lists "
                         f"{list(kv_cache_dtypes)})")
    if device.type == "cuda" and model_dtype == torch.float32:
        raise ValueError(f"kv_cache={kv_cache} on CUDA needs a float16/bfloat16 model, got "
                         "float32: serve in half precision or drop the option")
    if head_dim % FP8_TILE or head_dim > FP8_MAX_HEAD_DIM:
        raise ValueError(f"head dim {head_dim} cannot be tiled by the fp8 gather: it needs a "
                         f"multiple of {FP8_TILE} up to {FP8_MAX_HEAD_DIM}")
    if not device_stores_fp8(device):
        raise ValueError(f"kv_cache={kv_cache}: this torch build ({torch.__version__}) cannot "
                         f"store float8_e4m3fn on {device.type}; drop the option or upgrade torch")
    backend = attn_backend or os.environ.get(ATTN_BACKEND_ENV, "torch")
    if backend in FP8_REFUSED_BACKENDS:
        raise ValueError(f"kv_cache={kv_cache} is not served by {ATTN_BACKEND_ENV}={backend}: "
                         "unset it or use 'torch'")
