"""Zipformer2's encoder: the layer, the downsampled stacks and the output assembly.

Time-major, (T, B, C). A stack at downsampling factor ds runs at 50 / ds Hz: SimpleDownsample,
its layers, SimpleUpsample, then a learned bypass with its input. The encoder feeds each stack
the previous one's output (channels truncated or zero-padded to the stack's width) and builds
its output from the last stack plus, for wider earlier stacks, their extra channels, then
halves the frame rate (25 Hz).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from oasr.models.zipformer.config import ZipformerConfig
from oasr.models.zipformer.layers import (
    BiasNorm,
    Bypass,
    ConvModule,
    FeedForward,
    NonlinAttention,
    RelPositionAttentionWeights,
    SelfAttention,
)

LAYER_STATE_NAMES = ("cached_key", "cached_nonlin_attn", "cached_val1", "cached_val2",
                     "cached_conv1", "cached_conv2")


class LayerState(NamedTuple):
    """One layer's streaming cache (icefall's layout; L = left context // ds frames).

    cached_key (L, B, H * Dq); cached_nonlin_attn (1, B, L, 3 * dim // 4);
    cached_val1, cached_val2 (L, B, H * Dv); cached_conv1, cached_conv2 (B, dim, kernel // 2).
    """

    cached_key: Tensor
    cached_nonlin_attn: Tensor
    cached_val1: Tensor
    cached_val2: Tensor
    cached_conv1: Tensor
    cached_conv2: Tensor


class ZipformerEncoderLayer(nn.Module):
    """ff1, nonlin attention, self-attention, conv, ff2, mid bypass, self-attention, conv,
    ff3, BiasNorm, bypass; both self-attentions and the nonlin attention share one set of
    attention weights."""

    def __init__(self, cfg: ZipformerConfig, stack: int) -> None:
        super().__init__()
        dim, heads = cfg.encoder_dim[stack], cfg.num_heads[stack]
        ff, kernel = cfg.feedforward_dim[stack], cfg.cnn_module_kernel[stack]
        self.self_attn_weights = RelPositionAttentionWeights(
            dim, cfg.pos_dim, heads, cfg.query_head_dim[stack], cfg.pos_head_dim[stack])
        self.self_attn1 = SelfAttention(dim, heads, cfg.value_head_dim[stack])
        self.self_attn2 = SelfAttention(dim, heads, cfg.value_head_dim[stack])
        self.feed_forward1 = FeedForward(dim, (ff * 3) // 4)
        self.feed_forward2 = FeedForward(dim, ff)
        self.feed_forward3 = FeedForward(dim, (ff * 5) // 4)
        self.nonlin_attention = NonlinAttention(dim, 3 * dim // 4)
        self.conv_module1 = ConvModule(dim, kernel)
        self.conv_module2 = ConvModule(dim, kernel)
        self.norm = BiasNorm(dim)
        self.bypass = Bypass(dim)
        self.bypass_mid = Bypass(dim)

    def forward(self, x: Tensor, pad_mask: Tensor | None, attn_mask: Tensor | None,
                chunk: int) -> Tensor:
        """Whole sequence (full context, or chunked by ``attn_mask`` and ``chunk``).

        Args:
            x: (T, B, C); pad_mask: (B, T) True at padding; attn_mask: (T, T) True where a
            query may not see a key; chunk: conv chunk in this stack's frames (< 0: whole).
        Returns:
            (T, B, C).
        """
        orig = x
        weights, _ = self.self_attn_weights(x, None, pad_mask, attn_mask)  # (H, B, T, T)
        x = x + self.feed_forward1(x)
        x = x + self.nonlin_attention(x, weights[0:1], None)[0]
        x = x + self.self_attn1(x, weights, None)[0]
        x = x + self.conv_module1(x, pad_mask, chunk)
        x = x + self.feed_forward2(x)
        x = self.bypass_mid(orig, x)
        x = x + self.self_attn2(x, weights, None)[0]
        x = x + self.conv_module2(x, pad_mask, chunk)
        x = x + self.feed_forward3(x)
        return self.bypass(orig, self.norm(x))

    def init_state(self, left: int, batch: int, device: torch.device | str,
                   dtype: torch.dtype) -> LayerState:
        """The zero cache of ``batch`` streams with ``left`` frames of left context, shaped by
        this layer's own modules (icefall's layout: see `LayerState`)."""
        attn = self.self_attn_weights
        key = attn.num_heads * attn.query_head_dim
        conv1 = self.conv_module1.depthwise_conv
        conv2 = self.conv_module2.depthwise_conv

        def zeros(*shape: int) -> Tensor:
            return torch.zeros(shape, device=device, dtype=dtype)

        return LayerState(
            cached_key=zeros(left, batch, key),
            cached_nonlin_attn=zeros(1, batch, left, self.nonlin_attention.hidden),
            cached_val1=zeros(left, batch, self.self_attn1.in_proj.out_features),
            cached_val2=zeros(left, batch, self.self_attn2.in_proj.out_features),
            cached_conv1=zeros(batch, conv1.causal_conv.in_channels, conv1.kernel_size // 2),
            cached_conv2=zeros(batch, conv2.causal_conv.in_channels, conv2.kernel_size // 2),
        )

    def streaming_forward(self, x: Tensor, state: LayerState,
                          pad_mask: Tensor) -> tuple[Tensor, LayerState]:
        """One chunk after the cached left context.

        Args:
            x: (T, B, C) the chunk; state: the cache (L frames); pad_mask: (B, L + T) True
            for unfilled cache frames and padded chunk frames.
        Returns:
            (T, B, C) and the new cache (the last L frames of cache + chunk).
        """
        L = state.cached_key.shape[0]
        orig = x
        weights, keys = self.self_attn_weights(x, state.cached_key, pad_mask)  # (H, B, T, L+T)
        x = x + self.feed_forward1(x)
        na, nonlin = self.nonlin_attention(x, weights[0:1], state.cached_nonlin_attn)
        x = x + na
        sa, val1 = self.self_attn1(x, weights, state.cached_val1)
        x = x + sa
        chunk_mask = pad_mask[:, L:]  # (B, T)
        conv, conv1 = self.conv_module1.streaming_forward(x, chunk_mask, state.cached_conv1)
        x = x + conv
        x = x + self.feed_forward2(x)
        x = self.bypass_mid(orig, x)
        sa, val2 = self.self_attn2(x, weights, state.cached_val2)
        x = x + sa
        conv, conv2 = self.conv_module2.streaming_forward(x, chunk_mask, state.cached_conv2)
        x = x + conv
        x = x + self.feed_forward3(x)
        x = self.bypass(orig, self.norm(x))
        new = LayerState(keys[-L:], nonlin[:, :, -L:], val1[-L:], val2[-L:], conv1, conv2)
        return x, new


def simple_downsample(x: Tensor, bias: Tensor) -> Tensor:
    """Weighted sum of each group of ds frames, weights softmax(bias); the last group is
    completed by repeating the last frame. x: (T, B, C) -> (ceil(T / ds), B, C)."""
    ds = bias.shape[0]
    T, B, C = x.shape
    groups = (T + ds - 1) // ds
    if groups * ds > T:
        x = torch.cat([x, x[-1:].expand(groups * ds - T, B, C)], dim=0)
    weights = bias.softmax(dim=0).reshape(1, ds, 1, 1)
    return (x.reshape(groups, ds, B, C) * weights).sum(dim=1)  # (T / ds, B, C)


class ZipformerStack(nn.Module):
    """The layers of one stack, with its downsampling (``downsample_bias``, ds weights) and
    output bypass when ds > 1."""

    def __init__(self, cfg: ZipformerConfig, stack: int) -> None:
        super().__init__()
        self.ds = cfg.downsampling_factor[stack]
        self.layers = nn.ModuleList(
            ZipformerEncoderLayer(cfg, stack) for _ in range(cfg.num_encoder_layers[stack]))
        if self.ds > 1:
            self.downsample_bias = nn.Parameter(torch.zeros(self.ds))
            self.out_combiner = Bypass(cfg.encoder_dim[stack])

    def forward(self, x: Tensor, pad_mask: Tensor | None, attn_mask: Tensor | None,
                chunk: int) -> Tensor:
        """x: (T, B, C) at 50 Hz; masks at 50 Hz (taken every ds-th here) -> (T, B, C)."""
        if self.ds > 1:
            orig = x
            x = simple_downsample(x, self.downsample_bias)  # (T / ds, B, C)
            pad_mask = None if pad_mask is None else pad_mask[:, :: self.ds]
            attn_mask = None if attn_mask is None else attn_mask[:: self.ds, :: self.ds]
            chunk = chunk // self.ds
        for layer in self.layers:
            x = layer(x, pad_mask, attn_mask, chunk)
        if self.ds == 1:
            return x
        x = x.repeat_interleave(self.ds, dim=0)[: orig.shape[0]]  # (T, B, C)
        return self.out_combiner(orig, x)

    def init_states(self, left: int, batch: int, device: torch.device | str,
                    dtype: torch.dtype) -> list[LayerState]:
        """Each layer's zero cache for ``left`` frames of 50 Hz left context (``left // ds``
        at this stack's rate)."""
        return [layer.init_state(left // self.ds, batch, device, dtype)  # type: ignore[operator]
                for layer in self.layers]

    def streaming_forward(self, x: Tensor, states: list[LayerState],
                          pad_mask: Tensor) -> tuple[Tensor, list[LayerState]]:
        """x: (T, B, C) one chunk at 50 Hz; states: one per layer; pad_mask (B, left + T) at
        50 Hz -> (T, B, C) and the new states."""
        orig = x
        if self.ds > 1:
            x = simple_downsample(x, self.downsample_bias)  # (T / ds, B, C)
        pad_mask = pad_mask[:, :: self.ds]  # (B, left / ds + T / ds)
        new = []
        for layer, state in zip(self.layers, states, strict=True):
            assert isinstance(layer, ZipformerEncoderLayer)
            x, s = layer.streaming_forward(x, state, pad_mask)
            new.append(s)
        if self.ds == 1:
            return x, new
        x = x.repeat_interleave(self.ds, dim=0)[: orig.shape[0]]  # (T, B, C)
        return self.out_combiner(orig, x), new


class ZipformerEncoder(nn.Module):
    """The stacks in order and the output assembly (``downsample_output_bias``: 2 weights)."""

    def __init__(self, cfg: ZipformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.stacks = nn.ModuleList(ZipformerStack(cfg, s) for s in range(cfg.num_stacks))
        self.downsample_output_bias = nn.Parameter(torch.zeros(2))

    def forward(self, x: Tensor, pad_mask: Tensor | None, chunk: int,
                left_chunks: int) -> Tensor:
        """Whole utterances, full context (chunk < 0) or chunk-masked (simulated streaming).

        Args:
            x: (T, B, C0) at 50 Hz; pad_mask: (B, T) True at padding.
            chunk, left_chunks: attention chunk and left context in chunks (-1: unlimited).
        Returns:
            (ceil(T / 2), B, output_dim) at 25 Hz.
        """
        attn_mask = None if chunk < 0 else chunk_attention_mask(x.shape[0], chunk, left_chunks,
                                                                x.device)
        outputs = []
        for stack, dim in zip(self.stacks, self.cfg.encoder_dim, strict=True):
            x = stack(fit_channels(x, dim), pad_mask, attn_mask, chunk)
            outputs.append(x)
        return simple_downsample(self._assemble(outputs), self.downsample_output_bias)

    def get_streaming_init_states(self, batch: int, device: torch.device | str,
                                  dtype: torch.dtype) -> list[list[LayerState]]:
        """The zero caches of ``batch`` streams, [stack][layer], each shaped by its layer's
        modules at the config's left context (icefall's ``get_init_states`` of the encoder)."""
        left = self.cfg.left_context_frames
        return [stack.init_states(left, batch, device, dtype)  # type: ignore[operator]
                for stack in self.stacks]

    def streaming_forward(self, x: Tensor, states: list[list[LayerState]],
                          pad_mask: Tensor) -> tuple[Tensor, list[list[LayerState]]]:
        """One chunk. x: (T, B, C0); states[stack][layer]; pad_mask (B, left + T).

        Returns:
            (T / 2, B, output_dim) and the new states, same nesting.
        """
        outputs, new = [], []
        for stack, dim, stack_states in zip(self.stacks, self.cfg.encoder_dim, states, strict=True):
            assert isinstance(stack, ZipformerStack)
            x, s = stack.streaming_forward(fit_channels(x, dim), stack_states, pad_mask)
            outputs.append(x)
            new.append(s)
        return simple_downsample(self._assemble(outputs), self.downsample_output_bias), new

    def _assemble(self, outputs: list[Tensor]) -> Tensor:
        """The last stack's output, then each earlier wider stack's extra channels."""
        pieces = [outputs[-1]]
        width = self.cfg.encoder_dim[-1]
        for out, dim in zip(outputs[-2::-1], self.cfg.encoder_dim[-2::-1], strict=True):
            if dim > width:
                pieces.append(out[..., width:dim])
                width = dim
        return torch.cat(pieces, dim=-1)  # (T, B, output_dim)


def fit_channels(x: Tensor, dim: int) -> Tensor:
    """Truncate or zero-pad the last axis of x to ``dim`` channels."""
    if dim <= x.shape[-1]:
        return x[..., :dim]
    return F.pad(x, (0, dim - x.shape[-1]))


def chunk_attention_mask(T: int, chunk: int, left_chunks: int, device: torch.device) -> Tensor:
    """(T, T) True where query frame i may not see key frame j: j in a later chunk, or more
    than ``left_chunks`` chunks back (< 0: unlimited)."""
    c = torch.arange(T, device=device) // chunk
    far = c.unsqueeze(1) - c.unsqueeze(0)  # (T, T) query chunk - key chunk
    if left_chunks < 0:
        return far < 0
    return (far < 0) | (far > left_chunks)
