"""Whisper in PyTorch: a conv-stem Transformer encoder over 30 s of log-mel and a Transformer
decoder with self- and cross-attention, pre-norm blocks, exact (erf) GELU, LayerNorm eps 1e-5,
learned-or-stored positional tables, and an output projection tied to the token embedding.

The decoder holds no K/V: every attention read goes through a ``DecoderKvStore`` the caller owns
(dense per-group buffers or the paged pool), so the same forward serves both storages.

The blocks' linears go through `oasr.models.fused_linear.linear`: in bfloat16 on a CPU that
multiplies it natively, each is one oneDNN call with its bias, GELU or residual add inside
(the weights packed once, `prepack`); elsewhere the plain ops, the same maths.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from oasr.models.fused_linear import fusable, linear, packed_weight
from oasr.models.whisper.config import WhisperConfig
from oasr.models.whisper.logits import LogitsProjection


class DecoderKvStore(Protocol):
    """Where a decoder forward stores and reads its K/V, for one batch of B rows.

    Shapes: q, k, v are (B, T, H, D); outputs (B, T, H, D). A forward calls ``begin`` once
    (the store makes room for T more tokens per row, allocating pages if it is paged, and
    returns their positions), then per layer ``attend_self`` (store the new tokens' K/V at each
    row's next positions, attend causally over the row's cached plus new tokens) and
    ``attend_cross`` (attend over the row's stored encoder K/V), then ``advance`` once.
    """

    def begin(self, num_tokens: int) -> torch.Tensor:
        """(B, num_tokens) int64 positions of the next tokens of each row."""
        ...

    def attend_self(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def attend_cross(self, layer: int, q: torch.Tensor) -> torch.Tensor: ...

    def advance(self, num_tokens: int) -> None: ...


class FeedForward(nn.Module):
    """LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d); the residual is the block's."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d) -> (B, T, d), plus ``residual`` (B, T, d) when given."""
        return linear(linear(self.norm(x), self.up, gelu=True), self.down, residual=residual)


class EncoderBlock(nn.Module):
    """Pre-norm self-attention (fused QKV projection) then feed-forward."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ffn = FeedForward(width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d), optional mask (B, 1, T, T) bool (True = may attend) -> (B, T, d)."""
        batch, frames, width = x.shape
        qkv = linear(self.attn_norm(x), self.qkv).view(batch, frames, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
        x = linear(att.transpose(1, 2).reshape(batch, frames, width), self.out, residual=x)
        return self.ffn(x, residual=x)


class WhisperEncoder(nn.Module):
    """Two GELU convs (the second stride 2), a stored positional table, pre-norm blocks, a final
    LayerNorm. Input is one 30 s window, or a shorter prefix of it (see ``forward``)."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        width = config.n_audio_state
        self.conv1 = nn.Conv1d(config.n_mels, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.positions: torch.Tensor
        self.register_buffer("positions", torch.zeros(config.n_audio_ctx, width))
        self.blocks = nn.ModuleList(
            EncoderBlock(width, config.n_audio_head) for _ in range(config.n_audio_layer)
        )
        self.norm = nn.LayerNorm(width)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """(B, n_mels, T) log-mel -> (B, T / 2, n_audio_state) encoder states.

        T is 3000 for Whisper's 30 s window; a shorter even T (a window cut to a segment's
        length) uses the first T / 2 rows of the positional table.
        """
        frames = mel.size(-1)
        full = self.config.n_input_frames
        if mel.dim() != 3 or mel.size(1) != self.config.n_mels or frames % 2 or not 2 <= frames <= full:
            raise ValueError(
                f"encoder input must be (B, {self.config.n_mels}, T) with T even and 2 <= T <= "
                f"{full}, got {tuple(mel.shape)}"
            )
        x = F.gelu(self.conv1(mel.to(self.conv1.weight.dtype)))  # (B, d, T)
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, T / 2, d)
        x = x + self.positions[: frames // 2].to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class DecoderBlock(nn.Module):
    """Pre-norm causal self-attention, cross-attention over the encoder, feed-forward."""

    def __init__(self, width: int, heads: int, index: int) -> None:
        super().__init__()
        self.heads = heads
        self.index = index
        self.self_norm = nn.LayerNorm(width)
        self.self_qkv = nn.Linear(width, 3 * width)
        self.self_out = nn.Linear(width, width)
        self.cross_norm = nn.LayerNorm(width)
        self.cross_q = nn.Linear(width, width)
        self.cross_kv = nn.Linear(width, 2 * width)
        self.cross_out = nn.Linear(width, width)
        self.ffn = FeedForward(width)

    def project_cross_kv(self, encoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, d) encoder states -> K, V each (B, S, H, D)."""
        batch, frames, _ = encoded.shape
        kv = linear(encoded, self.cross_kv).view(batch, frames, 2, self.heads, -1)
        return kv[:, :, 0], kv[:, :, 1]

    def forward(self, x: torch.Tensor, kv: DecoderKvStore) -> torch.Tensor:
        """(B, T, d) -> (B, T, d); stores this layer's new self-attention K/V through ``kv``."""
        batch, tokens, width = x.shape
        qkv = linear(self.self_norm(x), self.self_qkv).view(batch, tokens, 3, self.heads, -1)
        att = kv.attend_self(self.index, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])  # (B,T,H,D)
        x = linear(att.reshape(batch, tokens, width), self.self_out, residual=x)
        q = linear(self.cross_norm(x), self.cross_q).view(batch, tokens, self.heads, -1)
        att = kv.attend_cross(self.index, q)  # (B, T, H, D)
        x = linear(att.reshape(batch, tokens, width), self.cross_out, residual=x)
        return self.ffn(x, residual=x)


class WhisperDecoder(nn.Module):
    """Token embedding plus a stored positional table, pre-norm blocks, final LayerNorm, logits
    through the (tied) token embedding."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        width = config.n_text_state
        self.embedding = nn.Embedding(config.n_vocab, width)
        self.positions: torch.Tensor
        self.register_buffer("positions", torch.zeros(config.n_text_ctx, width))
        self.blocks = nn.ModuleList(
            DecoderBlock(width, config.n_text_head, i) for i in range(config.n_text_layer)
        )
        self.norm = nn.LayerNorm(width)
        self.logits = LogitsProjection(self.embedding.weight)  # tied to the embedding

    def cross_kv(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the cross-attention K, V, each (B, S, H, D), of encoder states (B, S, d)."""
        return [block.project_cross_kv(encoded) for block in self._blocks()]

    def _blocks(self) -> list[DecoderBlock]:
        return [b for b in self.blocks if isinstance(b, DecoderBlock)]

    def forward(self, tokens: torch.Tensor, kv: DecoderKvStore) -> torch.Tensor:
        """Run ``tokens`` (B, T) after what ``kv`` holds; returns logits (B, T, n_vocab) float32.

        Advances ``kv`` by T tokens.
        """
        return self.logits(self.hidden(tokens, kv))  # (B, T, V) float32

    def hidden(self, tokens: torch.Tensor, kv: DecoderKvStore) -> torch.Tensor:
        """``forward`` up to the output projection: the final states (B, T, d), for a caller
        that projects only what it ranks (`LogitsProjection.top_log_probs`). Advances ``kv``."""
        positions = kv.begin(tokens.size(1))  # (B, T); the store checks its capacity
        x = self.embedding(tokens) + self.positions[positions].to(self.embedding.weight.dtype)
        for block in self._blocks():
            x = block(x, kv)
        kv.advance(tokens.size(1))
        return self.norm(x)


class WhisperModel(nn.Module):
    """Encoder + decoder + the checkpoint's config; holds no request state."""

    kv_cache_dtypes = ("fp8_e4m3",)  # decoder K/V formats besides the served dtype

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WhisperEncoder(config)
        self.decoder = WhisperDecoder(config)

    @property
    def device(self) -> torch.device:
        return self.decoder.embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embedding.weight.dtype


def prepack(model: WhisperModel) -> int:
    """Reorder every weight the fused blocks multiply by (`oasr.models.fused_linear`) now, so
    the first decode served does not: the encoder's and decoder's block linears (the decoder's
    cross K/V projection included). Call once the model has its serving dtype and device; a
    no-op where the linears do not fuse (float32, CUDA). Returns the weights packed."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is nn.Linear and fusable(module.weight):
                packed_weight(module.weight)
                count += 1
    return count
