"""Zipformer2's building blocks at inference (icefall ``zipformer.py`` / ``scaling.py``).

Time-major throughout, as icefall's encoder: a sequence is (T, B, C). Training-only modules
(balancers, whiteners, dropout, ScheduledFloat schedules) are identities at inference and are
not built. Every module is stateless: a streaming call takes its cached left context as an
argument and returns the new one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MASKED_SCORE = -1000.0  # icefall fills masked attention scores with -1000, not -inf


def swoosh_l(x: Tensor) -> Tensor:
    """SwooshL(x) = log(1 + exp(x - 4)) - 0.08 x - 0.035, elementwise."""
    return F.softplus(x - 4.0, threshold=30.0) - 0.08 * x - 0.035


def swoosh_r(x: Tensor) -> Tensor:
    """SwooshR(x) = log(1 + exp(x - 1)) - 0.08 x - 0.313261687, elementwise."""
    return F.softplus(x - 1.0, threshold=30.0) - 0.08 * x - 0.313261687


class BiasNorm(nn.Module):
    """y = x * exp(log_scale) / rms(x - bias) over the last axis (no epsilon; the bias only
    enters the rms)."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(()))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        scales = torch.mean((x - self.bias) ** 2, dim=-1, keepdim=True) ** -0.5
        return x * (scales * self.log_scale.exp())


class Bypass(nn.Module):
    """``orig + (x - orig) * bypass_scale``: a learned per-channel skip (0 skips the module)."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.bypass_scale = nn.Parameter(torch.full((num_channels,), 0.5))

    def forward(self, orig: Tensor, x: Tensor) -> Tensor:
        """orig, x: (T, B, C) -> (T, B, C)."""
        return orig + (x - orig) * self.bypass_scale


class FeedForward(nn.Module):
    """Linear, SwooshL, Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, hidden)
        self.out_proj = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        """x: (T, B, C) -> (T, B, C)."""
        return self.out_proj(swoosh_l(self.in_proj(x)))


def compact_rel_positions(offsets: Tensor, pos_dim: int) -> Tensor:
    """CompactRelPositionalEncoding of integer offsets (key position - query position).

    The offset is log-compressed past sqrt(pos_dim), mapped through atan onto (-pi/2, pi/2)
    and Fourier-expanded; the last channel is a constant 1 (a bias). Computed in float32.

    Args:
        offsets: (N,) relative offsets.
    Returns:
        (N, pos_dim) float32 encodings.
    """
    x = offsets.to(torch.float32).unsqueeze(1)  # (N, 1)
    freqs = 1 + torch.arange(pos_dim // 2, device=offsets.device)  # (D/2,)
    compression = pos_dim**0.5
    compressed = compression * x.sign() * ((x.abs() + compression).log() - math.log(compression))
    angle = (compressed / (pos_dim / (2.0 * math.pi))).atan()  # (N, 1)
    pe = torch.zeros(x.shape[0], pos_dim, device=offsets.device)
    pe[:, 0::2] = (angle * freqs).cos()
    pe[:, 1::2] = (angle * freqs).sin()
    pe[:, -1] = 1.0
    return pe


class RelPositionAttentionWeights(nn.Module):
    """Multi-head attention weights with compact relative positions, shared by the layer's
    two SelfAttention modules and (head 0) its NonlinAttention.

    scores = q . k + p . linear_pos(pe(key_pos - query_pos)), no 1/sqrt(d) scaling; masked
    scores are set to -1000 before the softmax. ``in_proj`` packs q | k | p, head-major.
    """

    def __init__(self, dim: int, pos_dim: int, num_heads: int, query_head_dim: int,
                 pos_head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query_head_dim = query_head_dim
        self.pos_head_dim = pos_head_dim
        self.pos_dim = pos_dim
        self.in_proj = nn.Linear(dim, (2 * query_head_dim + pos_head_dim) * num_heads)
        self.linear_pos = nn.Linear(pos_dim, num_heads * pos_head_dim, bias=False)

    def forward(self, x: Tensor, cached_key: Tensor | None, key_padding_mask: Tensor | None,
                attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Attention weights of T queries over L cached + T new keys.

        Args:
            x: (T, B, C) the layer input.
            cached_key: (L, B, H * Dq) keys of the L left-context frames; None for L = 0.
            key_padding_mask: (B, L + T) True where a key is masked; None for none.
            attn_mask: (T, L + T) True where a query may not see a key; None for none.
        Returns:
            weights (H, B, T, L + T) and all L + T keys (L + T, B, H * Dq).
        """
        T, B, _ = x.shape
        H, dq, dp = self.num_heads, self.query_head_dim, self.pos_head_dim
        proj = self.in_proj(x)  # (T, B, H * (2 Dq + Dp))
        q, k, p = proj[..., : H * dq], proj[..., H * dq : 2 * H * dq], proj[..., 2 * H * dq :]
        if cached_key is not None:
            k = torch.cat([cached_key, k], dim=0)  # (L + T, B, H * Dq)
        S = k.shape[0]  # L + T
        q = q.reshape(T, B, H, dq).permute(2, 1, 0, 3)  # (H, B, T, Dq)
        kt = k.reshape(S, B, H, dq).permute(2, 1, 3, 0)  # (H, B, Dq, S)
        scores = torch.matmul(q, kt)  # (H, B, T, S)
        # offsets -(L + T - 1) .. T - 1; query i, key j (key positions -L .. T-1) -> T-1-i+j
        offsets = torch.arange(-(S - 1), T, device=x.device)
        pe = self.linear_pos(compact_rel_positions(offsets, self.pos_dim).to(x.dtype))
        pe = pe.reshape(-1, H, dp).permute(1, 2, 0)  # (H, Dp, 2T + L - 1)
        p = p.reshape(T, B, H, dp).permute(2, 1, 0, 3)  # (H, B, T, Dp)
        pos = torch.matmul(p, pe.unsqueeze(1))  # (H, B, T, 2T + L - 1)
        index = (T - 1 - torch.arange(T, device=x.device)).unsqueeze(1) + torch.arange(
            S, device=x.device)  # (T, S)
        scores = scores + pos.gather(3, index.expand(H, B, T, S))  # (H, B, T, S)
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask, MASKED_SCORE)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask.unsqueeze(1), MASKED_SCORE)
        return scores.softmax(dim=-1), k


class SelfAttention(nn.Module):
    """Values from ``in_proj``, weighted by the shared attention weights, ``out_proj``."""

    def __init__(self, dim: int, num_heads: int, value_head_dim: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, num_heads * value_head_dim)
        self.out_proj = nn.Linear(num_heads * value_head_dim, dim)

    def forward(self, x: Tensor, weights: Tensor, cached_val: Tensor | None) -> tuple[Tensor, Tensor]:
        """Args: x (T, B, C); weights (H, B, T, L + T); cached_val (L, B, H * Dv) or None.

        Returns:
            (T, B, C) and all L + T values (L + T, B, H * Dv).
        """
        T, B, _ = x.shape
        H = weights.shape[0]
        v = self.in_proj(x)  # (T, B, H * Dv)
        if cached_val is not None:
            v = torch.cat([cached_val, v], dim=0)  # (L + T, B, H * Dv)
        heads = v.reshape(v.shape[0], B, H, -1).permute(2, 1, 0, 3)  # (H, B, L + T, Dv)
        out = torch.matmul(weights, heads)  # (H, B, T, Dv)
        out = out.permute(2, 1, 0, 3).reshape(T, B, -1)  # (T, B, H * Dv)
        return self.out_proj(out), v


class NonlinAttention(nn.Module):
    """s, x, y = in_proj(src); out_proj((attn[0] @ (x * tanh(s))) * y), hidden 3 * dim // 4."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.in_proj = nn.Linear(dim, 3 * hidden)
        self.out_proj = nn.Linear(hidden, dim)

    def forward(self, x: Tensor, weights: Tensor, cached_x: Tensor | None) -> tuple[Tensor, Tensor]:
        """Args: x (T, B, C); weights (1, B, T, L + T) (head 0);
        cached_x (1, B, L, hidden) or None.

        Returns:
            (T, B, C) and all L + T gated inputs (1, B, L + T, hidden).
        """
        T, B, _ = x.shape
        s, v, y = self.in_proj(x).chunk(3, dim=2)  # 3 x (T, B, hidden)
        v = (v * s.tanh()).permute(1, 0, 2).unsqueeze(0)  # (1, B, T, hidden)
        if cached_x is not None:
            v = torch.cat([cached_x, v], dim=2)  # (1, B, L + T, hidden)
        out = torch.matmul(weights, v)  # (1, B, T, hidden)
        out = out.permute(2, 1, 0, 3).reshape(T, B, self.hidden)  # (T, B, hidden)
        return self.out_proj(out * y), v


class ChunkCausalDepthwiseConv1d(nn.Module):
    """A depthwise conv that is causal chunk by chunk.

    A causal conv of (k + 1) // 2 taps (left context: k // 2 zero frames or the cache) plus a
    k-tap conv applied within each chunk (zero padding at both chunk edges), scaled per
    position by ``1 + left_edge + right_edge`` (``chunkwise_conv_scale``).
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"cnn_module_kernel must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.causal_conv = nn.Conv1d(channels, channels, (kernel_size + 1) // 2, groups=channels)
        self.chunkwise_conv = nn.Conv1d(channels, channels, kernel_size, groups=channels,
                                        padding=kernel_size // 2)
        self.chunkwise_conv_scale = nn.Parameter(torch.zeros(2, channels, kernel_size))

    def chunk_scale(self, chunk: int) -> Tensor:
        """(C, chunk) per-position scale of the chunkwise conv's output."""
        left, right = self.chunkwise_conv_scale[0], self.chunkwise_conv_scale[1]  # (C, k)
        if chunk < self.kernel_size:
            left, right = left[:, :chunk], right[:, -chunk:]
        else:
            pad = chunk - self.kernel_size
            left, right = F.pad(left, (0, pad)), F.pad(right, (pad, 0))
        return 1.0 + (left + right)

    def forward(self, x: Tensor, chunk: int) -> Tensor:
        """Whole sequence, cut into chunks of ``chunk`` frames (< 0: one chunk).

        Args:
            x: (B, C, T).
        Returns:
            (B, C, T).
        """
        B, C, T = x.shape
        left_pad = self.kernel_size // 2
        if chunk < 0 or chunk > T:
            chunk = T
        right_pad = -T % chunk
        padded = F.pad(x, (left_pad, right_pad))  # (B, C, k//2 + T + right_pad)
        causal = self.causal_conv(padded[..., : left_pad + T])  # (B, C, T)
        n = (T + right_pad) // chunk
        chunks = padded[..., left_pad:].reshape(B, C, n, chunk).permute(0, 2, 1, 3)
        chunks = self.chunkwise_conv(chunks.reshape(B * n, C, chunk)) * self.chunk_scale(chunk)
        chunks = chunks.reshape(B, n, C, chunk).permute(0, 2, 1, 3).reshape(B, C, n * chunk)
        return chunks[..., :T] + causal

    def streaming_forward(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """One chunk (the whole of ``x``) after its cached left context.

        Args:
            x: (B, C, T); cache: (B, C, k // 2) the previous inputs.
        Returns:
            (B, C, T) and the new cache (B, C, k // 2).
        """
        full = torch.cat([cache, x], dim=2)  # (B, C, k//2 + T)
        causal = self.causal_conv(full)  # (B, C, T)
        chunk = self.chunkwise_conv(x) * self.chunk_scale(x.shape[2])  # (B, C, T)
        return chunk + causal, full[..., -(self.kernel_size // 2):]


class ConvModule(nn.Module):
    """in_proj, GLU (x * sigmoid(gate)), zero padded frames, chunk-causal depthwise conv,
    SwooshR, out_proj."""

    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, 2 * dim)
        self.depthwise_conv = ChunkCausalDepthwiseConv1d(dim, kernel_size)
        self.out_proj = nn.Linear(dim, dim)

    def _glu(self, x: Tensor, pad_mask: Tensor | None) -> Tensor:
        v, gate = self.in_proj(x).chunk(2, dim=2)  # 2 x (T, B, C)
        v = (v * gate.sigmoid()).permute(1, 2, 0)  # (B, C, T)
        if pad_mask is not None:
            v = v.masked_fill(pad_mask.unsqueeze(1), 0.0)
        return v

    def forward(self, x: Tensor, pad_mask: Tensor | None, chunk: int) -> Tensor:
        """x: (T, B, C); pad_mask: (B, T) True at padding; chunk: frames (< 0: whole)."""
        v = self.depthwise_conv(self._glu(x, pad_mask), chunk)  # (B, C, T)
        return self.out_proj(swoosh_r(v.permute(2, 0, 1)))

    def streaming_forward(self, x: Tensor, pad_mask: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """x: (T, B, C); pad_mask: (B, T); cache: (B, C, k // 2) -> (T, B, C), new cache."""
        v, cache = self.depthwise_conv.streaming_forward(self._glu(x, pad_mask), cache)
        return self.out_proj(swoosh_r(v.permute(2, 0, 1))), cache
