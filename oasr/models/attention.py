"""Multi-head self-attention with WeNet's relative-position term (absolute key positions).

scores[t, j] = ((q_t + pos_bias_u) . k_j + (q_t + pos_bias_v) . W_pos pe[p_j]) / sqrt(d_k)

where p_j is key j's absolute position. The position term does not depend on the query's
position, so ``W_pos pe`` is a per-layer table computed once and gathered per stream.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from oasr.fmha import PagedKVCache, gather_head_major, paged_attention, write_chunk_kv


class RelPositionAttention(nn.Module):
    """Self-attention of one Conformer block (WeNet key names: linear_q/k/v/out/pos, pos_bias_u/v).

    Holds a cached projected position table ``linear_pos(pe)`` (num_positions, H, d_k) as a
    plain attribute: derived from weights, never saved, rebuilt when the weight, device, dtype
    or table size changes.
    """

    def __init__(
        self,
        n_head: int,
        n_feat: int,
        dropout_rate: float,
        query_bias: bool = True,
        key_bias: bool = True,
        value_bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat, bias=query_bias)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat, bias=value_bias)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(n_head, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(n_head, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)
        self.dropout = nn.Dropout(p=dropout_rate)
        self._pos_table: Tensor | None = None
        self._pos_table_key: tuple | None = None

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, D) -> q, k, v each (B, T, H, d_k)."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k)
        v = self.linear_v(x).view(b, t, self.h, self.d_k)
        return q, k, v

    def forward(
        self, x: Tensor, mask: Tensor, pos_emb: Tensor, cache: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Dense attention (full utterance, or one stream's chunk with a dense cache).

        Args:
            x: (B, T, D) queries' input.
            mask: (B, 1|T, L) bool, True = may attend; an empty (0, 0, 0) tensor means no mask.
            pos_emb: (1, L, D) embeddings of the L keys' absolute positions.
            cache: (B, H, T_cache, 2 * d_k) earlier keys | values, or None / empty.
        Returns:
            out (B, T, D), new_cache (B, H, T_cache + T, 2 * d_k).
        """
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, d_k)
        if cache is not None and cache.size(0) > 0:
            k_cache, v_cache = torch.split(cache, self.d_k, dim=-1)
            k = torch.cat([k_cache, k], dim=2)  # (B, H, L, d_k)
            v = torch.cat([v_cache, v], dim=2)
        new_cache = torch.cat([k, v], dim=-1)  # (B, H, L, 2 * d_k)
        p = self.linear_pos(pos_emb.to(x.dtype)).view(pos_emb.size(0), -1, self.h, self.d_k)
        p = p.transpose(1, 2)  # (1, H, L, d_k)
        q_u = (q + self.pos_bias_u).transpose(1, 2)  # (B, H, T, d_k)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        scores = torch.matmul(q_u, k.transpose(-2, -1)) + torch.matmul(q_v, p.transpose(-2, -1))
        scores = scores / math.sqrt(self.d_k)  # (B, H, T, L)
        return self._attend(scores, v, mask), new_cache

    def _attend(self, scores: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """scores (B, H, T, L), v (B, H, L, d_k), mask (B, 1|T, L) or empty -> (B, T, D)."""
        b, _, t, _ = scores.shape
        if mask.size(-1) > 0:
            blocked = ~mask.unsqueeze(1)  # (B, 1, 1|T, L)
            scores = scores.masked_fill(blocked, float("-inf"))
            attn = torch.softmax(scores.float(), dim=-1).to(v.dtype).masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.matmul(self.dropout(attn), v)  # (B, H, T, d_k)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))

    def projected_positions(self, pe: Tensor) -> Tensor:
        """``linear_pos(pe)`` as (num_positions, H, d_k), cached while inputs are unchanged.

        Args:
            pe: (num_positions, D) float32 sinusoid table.
        """
        weight = self.linear_pos.weight
        if torch.is_grad_enabled() and weight.requires_grad:
            return self.linear_pos(pe.to(weight.dtype)).view(-1, self.h, self.d_k)
        key = (weight.data_ptr(), weight._version, weight.dtype, pe.data_ptr(), pe.size(0))
        if self._pos_table is None or self._pos_table_key != key:
            with torch.no_grad():
                table = self.linear_pos(pe.to(weight.dtype)).view(-1, self.h, self.d_k)
            self._pos_table, self._pos_table_key = table, key
        return self._pos_table

    def forward_paged(
        self,
        x: Tensor,
        cache: PagedKVCache,
        q_lens: Tensor,
        pos_table: Tensor,
        key_positions: Tensor,
    ) -> Tensor:
        """Chunk attention of B streams against their paged history (chunk K/V written first).

        Args:
            x: (B, T, D) the chunk's input, rows padded past ``q_lens``.
            cache: this layer's PagedKVCache; ``cache_seqlens`` = frames each row holds.
            q_lens: (B,) valid frames of each row's chunk.
            pos_table: (N, H, d_k) ``projected_positions`` of this layer.
            key_positions: (B, L) int64 absolute position of each gathered key column, clamped
                into [0, N); L = ``gather_length(cache, T)``.
        Returns:
            (B, T, D); padded rows hold finite values to be ignored.
        """
        b, t, _ = x.shape
        q, k, v = self._qkv(x)  # (B, T, H, d_k)
        write_chunk_kv(cache, k, v)
        # Head-major throughout: the gather lands in the layout the matmul reads and the bias
        # in the one paged_attention adds it in, so neither is copied again.
        p = gather_head_major(pos_table, key_positions)  # (H, B, L, d_k)
        q_v = (q + self.pos_bias_v).permute(2, 0, 1, 3)  # (H, B, T, d_k)
        bias = torch.matmul(q_v, p.transpose(-2, -1)).div_(math.sqrt(self.d_k))  # (H, B, T, L)
        out = paged_attention(
            q + self.pos_bias_u, cache, q_lens, attn_bias=bias.transpose(0, 1)
        )  # (B, T, H, d_k)
        return self.linear_out(out.reshape(b, t, self.h * self.d_k))
