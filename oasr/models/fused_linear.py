"""Linear layers as one oneDNN call each on CPU: prepacked weights, with the bias, the GELU
and the residual add done inside the matmul.

``F.linear`` with a bias on CPU first copies the bias into every output row and then
multiplies into it, the GELU after it and the residual add after the block are one more pass
each over the output. On a CPU with bfloat16 matrix units (AMX, AVX512-BF16) the matmul is so
fast that these passes cost as much as it does: in a 64-stream Whisper-CTC step in bfloat16
the bias copies, GELUs and residual adds took 30 ms against 26 ms of matmuls (torch.profiler,
Sapphire Rapids, one thread). `linear` instead calls ``torch.ops.mkldnn._linear_pointwise``
on a weight reordered once into oneDNN's blocked layout (kept in `_PACKED` while the weight
tensor is unchanged): one call, one write of the output.

When it applies (`fusable`): a CPU tensor in bfloat16, torch built with oneDNN and the CPU
multiplying bfloat16 natively; the layer an ``nn.Linear``. Everything else (float32, CUDA, an
`Int8Linear`) runs the plain ops; the maths is the same up to rounding (the fused call rounds
once, after the bias and the residual, where the plain ops round after each).
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from oasr import cpu

# id(weight) -> (a weak reference to it, its identity when packed, the packed weight); an
# entry is dropped when its weight is freed (tensors compare by value, so no WeakKeyDictionary)
_PACKED: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}
PACK_ROWS_HINT = 2048  # rows oneDNN picks the blocked layout for (a 64-stream chunk: 64 x 32)


@functools.cache
def _onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 matmuls natively here (AVX512-BF16 or AMX), as torch's
    CPU queries see it (the instructions oneDNN itself dispatches on)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
                and (torch.cpu._is_avx512_bf16_supported() or cpu.has_amx_tiles()))


def fusable(x: Tensor) -> bool:
    """Whether `linear` runs fused for an input like ``x`` (bfloat16 on a CPU that multiplies
    it natively, not under autograd)."""
    return (x.device.type == "cpu" and x.dtype == torch.bfloat16 and _onednn_bf16()
            and not (torch.is_grad_enabled() and x.requires_grad))


def _identity(weight: Tensor) -> tuple:
    """What makes a cached derivative of ``weight`` stale: its storage, dtype, shape and, for
    a tensor that counts them, in-place writes (an inference-mode tensor does not count them:
    such weights are replaced, by ``.to()`` or a new model, not written in place)."""
    version = None if weight.is_inference() else weight._version
    return (weight.data_ptr(), weight.dtype, tuple(weight.shape), version)


def packed_weight(weight: Tensor) -> Tensor:
    """``weight`` (N, K) reordered for oneDNN, cached until the tensor changes (its storage,
    dtype or version: a ``load_state_dict`` or ``.to()`` repacks it)."""
    key = _identity(weight)
    slot = id(weight)
    hit = _PACKED.get(slot)
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(),
                                                         PACK_ROWS_HINT)
    _PACKED[slot] = (weakref.ref(weight, lambda _ref: _PACKED.pop(slot, None)), key, packed)
    return packed


_CONV_AS_LINEAR: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}


def conv_weight_as_linear(conv: nn.Conv1d) -> Tensor:
    """A Conv1d's kernel (C_out, C_in, k) as the (C_out, k * C_in) weight of a Linear over
    its windows laid out tap-major: row ``[x[t], x[t + 1], ..., x[t + k - 1]]`` of (k, C_in).
    Cached like `packed_weight` (so it is also packed once)."""
    weight = conv.weight
    key = _identity(weight)
    slot = id(weight)
    hit = _CONV_AS_LINEAR.get(slot)
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    out_channels = weight.size(0)
    with torch.no_grad():
        flat = weight.detach().permute(0, 2, 1).reshape(out_channels, -1).contiguous()
    _CONV_AS_LINEAR[slot] = (weakref.ref(weight, lambda _ref: _CONV_AS_LINEAR.pop(slot, None)),
                             key, flat)
    return flat


def linear_weights(x: Tensor, weight: Tensor, bias: Tensor | None, *, gelu: bool = False,
                   residual: Tensor | None = None) -> Tensor:
    """``residual + gelu?(x @ weight.T + bias)`` as one call where `fusable`.

    Args:
        x: (M, K) rows, contiguous.
        weight: (N, K); bias: (N,) or None.
        gelu: apply the exact (erf) GELU to the product.
        residual: (M, N) added last, or None (not with ``gelu``).
    Returns:
        (M, N) in x's dtype.
    """
    if gelu and residual is not None:
        raise ValueError("linear_weights fuses a GELU or a residual add, not both")
    if not fusable(x) or weight.dtype != x.dtype:
        y = F.linear(x, weight, bias)
        y = F.gelu(y) if gelu else y
        return y if residual is None else residual + y
    packed = packed_weight(weight)
    if residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(
            x, residual.contiguous(), packed, bias, "add")  # (M, N)
    if gelu:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "gelu", [], "none")  # (M, N)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # (M, N)


def linear(x: Tensor, layer: nn.Module, *, gelu: bool = False,
           residual: Tensor | None = None) -> Tensor:
    """``residual + gelu?(layer(x))`` for any layer; one fused call for an ``nn.Linear`` where
    `fusable`.

    Args:
        x: (..., K); layer: an ``nn.Linear`` or any module mapping (..., K) -> (..., N);
        residual: (..., N) or None.
    Returns:
        (..., N).
    """
    if type(layer) is not nn.Linear or not fusable(x):
        y = layer(x)
        y = F.gelu(y) if gelu else y
        return y if residual is None else residual + y
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.size(-1))  # (M, K)
    res = None if residual is None else residual.reshape(rows.size(0), -1)  # (M, N)
    out = linear_weights(rows, layer.weight, layer.bias, gelu=gelu, residual=res)
    return out.view(*lead, out.size(-1))
