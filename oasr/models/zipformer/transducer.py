"""The transducer side of an icefall Zipformer: stateless decoder, joiner, greedy search."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StatelessDecoder(nn.Module):
    """Embedding of the last ``context_size`` tokens (negative ids embed to zero), a grouped
    Conv1d over them (groups of 4 channels, no bias), ReLU: an n-gram "prediction network"."""

    def __init__(self, vocab_size: int, dim: int, context_size: int) -> None:
        super().__init__()
        if context_size < 1:
            raise ValueError(f"context_size must be >= 1, got {context_size}")
        self.context_size = context_size
        self.embedding = nn.Embedding(vocab_size, dim)
        self.conv: nn.Module = (nn.Conv1d(dim, dim, context_size, groups=dim // 4, bias=False)
                                if context_size > 1 else nn.Identity())

    def forward(self, context: Tensor) -> Tensor:
        """context: (N, context_size) int token ids (-1: before the utterance) -> (N, dim)."""
        emb = self.embedding(context.clamp(min=0)) * (context >= 0).unsqueeze(-1)  # (N, U, D)
        if self.context_size == 1:
            return emb[:, 0]
        return F.relu(self.conv(emb.transpose(1, 2)))[..., 0]  # (N, D)


class Joiner(nn.Module):
    """logits = output_linear(tanh(encoder_proj(enc) + decoder_proj(dec)))."""

    def __init__(self, encoder_dim: int, decoder_dim: int, joiner_dim: int, vocab_size: int) -> None:
        super().__init__()
        self.encoder_proj = nn.Linear(encoder_dim, joiner_dim)
        self.decoder_proj = nn.Linear(decoder_dim, joiner_dim)
        self.output_linear = nn.Linear(joiner_dim, vocab_size)

    def forward(self, enc: Tensor, dec: Tensor, project_encoder: bool = True) -> Tensor:
        """enc: (..., encoder_dim) (or joiner_dim already projected); dec: (..., decoder_dim),
        broadcastable -> (..., vocab) logits."""
        if project_encoder:
            enc = self.encoder_proj(enc)
        return self.output_linear(torch.tanh(enc + self.decoder_proj(dec)))


def start_context(context_size: int, blank_id: int) -> list[int]:
    """The decoder context at the start of an utterance: [-1] * (ctx - 1) + [blank]."""
    return [-1] * (context_size - 1) + [blank_id]


class GreedyState:
    """One stream's greedy transducer hypothesis: tokens (after the start context) and the
    25 Hz frame each was emitted at. Plain host data, owned by the caller."""

    def __init__(self, context_size: int, blank_id: int) -> None:
        self._start = start_context(context_size, blank_id)
        self.context = list(self._start)
        self.tokens: list[int] = []
        self.frames: list[int] = []
        self.num_frames = 0  # frames consumed

    def reset(self) -> None:
        """Back to the start of an utterance (an endpoint)."""
        self.context = list(self._start)
        self.tokens = []
        self.frames = []
        self.num_frames = 0


def greedy_steps(decoder: StatelessDecoder, joiner: Joiner, enc_proj: Tensor,
                 lengths: list[int], states: list[GreedyState], blank_id: int) -> None:
    """Batched greedy transducer search, at most one symbol per frame, advancing ``states``.

    One decoder call per frame for the rows that emitted at the previous frame.

    Args:
        enc_proj: (B, T, joiner_dim) encoder output after ``joiner.encoder_proj``.
        lengths: valid frames per row (frames past a row's length are not searched).
        states: one per row, updated in place.
    """
    B, T, _ = enc_proj.shape
    ctx = decoder.context_size
    device = enc_proj.device
    contexts = torch.tensor([s.context[-ctx:] for s in states], device=device)  # (B, ctx)
    dec = decoder(contexts)  # (B, D)
    for t in range(T):
        active = [b for b in range(B) if t < lengths[b]]
        if not active:
            break
        rows = torch.tensor(active, device=device)
        logits = joiner(enc_proj[rows, t], dec[rows], project_encoder=False)  # (A, V)
        best = logits.argmax(dim=-1).tolist()
        emitted = []
        for b, token in zip(active, best, strict=True):
            state = states[b]
            if token != blank_id:
                state.context.append(token)
                state.tokens.append(token)
                state.frames.append(state.num_frames)
                emitted.append(b)
            state.num_frames += 1
        if emitted:
            ctx_rows = torch.tensor([states[b].context[-ctx:] for b in emitted], device=device)
            dec = dec.clone()
            dec[torch.tensor(emitted, device=device)] = decoder(ctx_rows)
