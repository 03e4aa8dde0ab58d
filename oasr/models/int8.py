"""Int8 weight-and-activation Linear layers for the encoders' matmuls.

`Int8Linear` stores a Linear's weight as int8, symmetric per output channel (one fp32 scale per
row of the weight), and quantizes each input row on the fly (absmax / 127), so the product is
an int8 x int8 -> int32 matmul (`torch._int_mm`) rescaled to float:

    y[m, n] = (sum_k qx[m, k] * qw[k, n]) * sx[m] * sw[n] + bias[n]

On a CPU with AVX512-VNNI that matmul runs at ~4.5x the fp32 rate (measured on the 2-core box:
406 vs 82-89 GFLOP/s for (2048 x 384) @ (384 x 1536)). Activations, residuals, LayerNorms,
attention and the K/V pool stay float32: only the Linear layers change.

`torch._int_mm`'s shape rules differ by device (CUDA: more than 16 rows, inner and output sizes
multiples of 8; CPU: any). One layout satisfies both, so the same code runs everywhere: the
weight is stored zero-padded to multiples of 8 in both dims (zeros add nothing), and a batch of
16 rows or fewer is zero-padded to 17 rows and sliced back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QMAX = 127  # symmetric int8: [-127, 127], so -x quantizes to -q(x)
ALIGN = 8  # torch._int_mm (CUDA): inner and output sizes multiples of 8
MIN_ROWS = 17  # torch._int_mm (CUDA): more than 16 rows
_TINY = 1e-12  # scale floor: an all-zero row quantizes to zeros, not NaN


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8 quantization.

    Args:
        x: (M, K) float.
    Returns:
        q (M, K) int8 with x ~= q * scale, and scale (M, 1) float32 = absmax(row) / 127.
    """
    # abs().amax(): a vectorised reduction (vector_norm(ord=inf) is ~7x slower on CPU)
    absmax = x.abs().amax(dim=1, keepdim=True).float()  # (M, 1)
    scale = absmax.clamp_min_(_TINY).div_(QMAX)
    q = (x * scale.reciprocal()).round_().to(torch.int8)  # |x / scale| <= 127 up to rounding
    return q, scale


class Int8Linear(nn.Module):
    """A Linear whose weights are int8 (per output channel) and whose inputs are quantized per
    row at run time.

    Invariant: ``weight_t`` is (K8, N8) int8, the transposed quantized weight zero-padded to
    multiples of 8; ``weight_scale`` (N,) and ``bias`` (N,) are float32 and unpadded. The
    transposed layout is what `torch._int_mm` takes as its second operand.

    Error: each product term carries two roundings of at most half a step (1/254 of a row's or
    channel's absmax), so the output's relative error is about 1% for Gaussian-like rows (a
    test bounds it); rows with one huge outlier lose the small entries' precision.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Int8Linear needs in_features >= 1 and out_features >= 1, "
                             f"got {in_features} x {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        k8, n8 = _round_up(in_features, ALIGN), _round_up(out_features, ALIGN)
        self.weight_t: Tensor
        self.weight_scale: Tensor
        self.register_buffer("weight_t", torch.zeros(k8, n8, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, device=device))
        self.bias: Tensor | None
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, device=device))
        else:
            self.bias = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize a float Linear (its weight per output channel, absmax / 127)."""
        weight = linear.weight.detach().float()  # (N, K)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    device=weight.device)
        q, scale = quantize_rows(weight)  # (N, K) int8, (N, 1)
        layer.weight_t[: linear.in_features, : linear.out_features] = q.t()
        layer.weight_scale.copy_(scale.squeeze(1))
        if linear.bias is not None:
            assert layer.bias is not None
            layer.bias.copy_(linear.bias.detach().float())
        return layer

    def dequantized_weight(self) -> Tensor:
        """(N, K) float32: the weight this layer actually multiplies by."""
        q = self.weight_t[: self.in_features, : self.out_features].t().float()
        return q * self.weight_scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """(..., K) float -> (..., N) in x's dtype."""
        if x.size(-1) != self.in_features:
            raise ValueError(f"Int8Linear expects {self.in_features} input features, "
                             f"got {x.size(-1)} (shape {tuple(x.shape)})")
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)  # (M, K)
        num_rows = rows.size(0)
        if num_rows == 0:
            return x.new_zeros(*lead, self.out_features)
        q, row_scale = quantize_rows(rows)  # (M, K) int8, (M, 1)
        k8 = self.weight_t.size(0)
        pad_rows = max(0, MIN_ROWS - num_rows)
        if pad_rows or k8 != self.in_features:
            q = F.pad(q, (0, k8 - self.in_features, 0, pad_rows))  # (M', K8)
        acc = torch._int_mm(q, self.weight_t)  # (M', N8) int32
        if pad_rows or acc.size(1) != self.out_features:
            acc = acc[:num_rows, : self.out_features]
        # in place on one new float32 tensor: a mixed int32 x float multiply is slower than
        # the conversion followed by same-dtype in-place ops
        out = acc.to(torch.float32).mul_(row_scale).mul_(self.weight_scale)  # (M, N)
        if self.bias is not None:
            out.add_(self.bias)
        return out.to(x.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8 per-channel weights, per-row activations")


def quantize_linears(module: nn.Module, skip: Callable[[str, nn.Linear], bool] | None = None,
                     ) -> list[str]:
    """Replace every `nn.Linear` under ``module`` by an `Int8Linear`, in place.

    Args:
        module: any module tree (its Linear layers may sit at any depth).
        skip: ``skip(qualified_name, linear)`` True keeps that Linear in float.
    Returns:
        The qualified names of the layers replaced, in module order.
    """
    replaced: list[str] = []
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            if type(sub) is not nn.Linear:
                continue
            qualified = f"{name}.{attr}" if name else attr
            if skip is not None and skip(qualified, sub):
                continue
            setattr(child, attr, Int8Linear.from_linear(sub))
            replaced.append(qualified)
    return replaced


def count_int8_linears(module: nn.Module) -> int:
    """How many `Int8Linear` layers ``module`` holds."""
    return sum(isinstance(m, Int8Linear) for m in module.modules())
