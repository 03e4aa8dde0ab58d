"""Attention of an autoregressive decoder over paged K/V: causal self-attention over a row's
growing tokens, cross-attention over its fixed encoder frames, FP8 pages included.

The cache layer's ``PagedDecoderKv`` holds the rows' block tables and lengths; the maths is
here. Every function takes one layer's ``PagedKVCache`` (the pool's K/V and the rows' block
table and lengths) and, for an FP8 pool, that layer's ``(k_scales, v_scales)``, each
(num_physical_blocks, block_size, n_kv_head) fp32.
"""

from __future__ import annotations

import torch

from oasr.fmha.fp8 import QuantizedKv, quantize_kv_store
from oasr.fmha.paged import (
    PagedKVCache,
    _chunk_slots,
    dense_attention,
    fused_cpu_attention,
    gather_length,
    key_padding_mask,
    write_chunk_kv,
)

Fp8Scales = tuple[torch.Tensor, torch.Tensor]

# torch's fused CPU attention, which also returns each query's log-sum-exp of its scores
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def causal_bias(num_cached: torch.Tensor, num_new: int, length: int) -> torch.Tensor | None:
    """(B, 1, T, L) additive mask letting new token t of row b see keys j <= num_cached[b] + t.

    None when ``num_new`` is 1: a lone new token sees every stored key of its row, which the
    key padding mask already says.
    """
    if num_new == 1:
        return None
    steps = torch.arange(num_new, device=num_cached.device)
    query_pos = num_cached.long().unsqueeze(1) + steps  # (B, T)
    keys = torch.arange(length, device=num_cached.device)
    hidden = keys[None, None, :] > query_pos[:, :, None]  # (B, T, L)
    bias = torch.zeros(hidden.shape, dtype=torch.float32, device=num_cached.device)
    return bias.masked_fill(hidden, float("-inf")).unsqueeze(1)


def write_decoder_kv(cache: PagedKVCache, k: torch.Tensor, v: torch.Tensor,
                     scales: Fp8Scales | None = None) -> None:
    """Write K, V (B, T, H, D) at positions cache_seqlens[b] + t of each row's pages;
    quantized to FP8 with per-vector scales when ``scales`` is given."""
    if scales is None:
        write_chunk_kv(cache, k, v)
        return
    heads, dim = k.shape[2:]
    k_store = QuantizedKv(cache.k_cache.view(-1, heads, dim), scales[0].view(-1, heads))
    v_store = QuantizedKv(cache.v_cache.view(-1, heads, dim), scales[1].view(-1, heads))
    slots = _chunk_slots(cache, k.size(1))  # (B * T,)
    quantize_kv_store(k.reshape(-1, heads, dim), v.reshape(-1, heads, dim), k_store, v_store,
                      slots)


def gather_pages_head_major(cache: PagedKVCache, length: int, dtype: torch.dtype,
                            scales: Fp8Scales | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' first ``length`` positions (whole pages), K and V each (H, B, length, D) in
    ``dtype``: one head-major gather per tensor, FP8 pages dequantized after the gather (only
    the pages read, never the pool)."""
    table = cache.block_table
    batch = table.size(0)
    ids = table[:, : length // cache.block_size].reshape(-1).long()  # (B * nb,)
    heads, dim = cache.k_cache.shape[2:]
    out = []
    pool_scales = (None, None) if scales is None else scales
    for pool, pool_scale in zip((cache.k_cache, cache.v_cache), pool_scales, strict=True):
        pages = pool.index_select(0, ids)  # (B * nb, page, H, D)
        if pool_scale is None:
            tiles = pages.to(dtype)
        else:
            tiles = QuantizedKv(pages, pool_scale.index_select(0, ids)).dequantize(dtype)
        tiles = tiles.view(batch, length, heads, dim).permute(2, 0, 1, 3)  # (H, B, L, D)
        out.append(tiles.contiguous())
    return out[0], out[1]


def attend_head_major(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      valid: torch.Tensor | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``dense_attention`` over head-major keys, with (head, row) pairs as its batch so every
    matmul operand is contiguous (a token-major (B, L, H, D) gather costs a copy per matmul).

    Args:
        q: (B, T, H, D); k, v: (H, B, L, D); valid: (B, L), or None when every key is real;
        bias: (B, 1 or H, T, L) or None.
    Returns:
        (B, T, H, D).
    """
    heads, batch, length, dim = k.shape
    tokens = q.size(1)
    q_flat = q.permute(2, 0, 1, 3).reshape(heads * batch, tokens, 1, dim)
    k_flat = k.reshape(heads * batch, length, 1, dim)
    v_flat = v.reshape(heads * batch, length, 1, dim)
    if bias is not None:
        bias = bias.expand(batch, heads, tokens, length).transpose(0, 1)
        bias = bias.reshape(heads * batch, 1, tokens, length)
    keep = None if valid is None else valid.repeat(heads, 1)
    out = dense_attention(q_flat, k_flat, v_flat, keep, bias)  # (HB, T, 1, D)
    return out.reshape(heads, batch, tokens, dim).permute(1, 2, 0, 3)


def decoder_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cache: PagedKVCache, scales: Fp8Scales | None = None) -> torch.Tensor:
    """Store the new tokens' K/V (B, T, H, D), then causal attention of q (B, T, H, D) over
    each row's stored tokens plus the new ones -> (B, T, H, D).

    ``cache.cache_seqlens`` (B,) are the tokens each row held before these; ``host_seqlen``
    their host-side maximum. A prefill into an empty FP8 cache attends its own K/V in the
    served dtype (its prompt's causal attention is not rounded to FP8).
    """
    num_new = q.size(1)
    write_decoder_kv(cache, k, v, scales)
    lens = cache.cache_seqlens
    if scales is not None and cache.host_seqlen == 0:
        fresh = torch.ones(q.size(0), num_new, dtype=torch.bool, device=q.device)
        return dense_attention(q, k, v, fresh, causal_bias(lens, num_new, num_new))
    length = gather_length(cache, num_new)
    keys, values = gather_pages_head_major(cache, length, q.dtype, scales)
    valid = key_padding_mask(lens + num_new, length)
    return attend_head_major(q, keys, values, valid, causal_bias(lens, num_new, length))


def decoder_cross_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            kv_lens: torch.Tensor) -> torch.Tensor:
    """q (B, T, H, D) over each row's ``kv_lens[b]`` encoder frames, keys and values (H, B, L, D)
    from `gather_pages_head_major` -> (B, T, H, D).

    On CPU, rows that all hold every gathered frame (Whisper's rows all hold the 1,500 frames
    of a window) attend unmasked: the softmax then runs in the operands' dtype without the
    masked path's cast, fill and cast-back passes over the scores."""
    valid = key_padding_mask(kv_lens, keys.size(2))
    if keys.device.type == "cpu" and bool(valid.all()):
        return attend_head_major(q, keys, values, None)
    return attend_head_major(q, keys, values, valid)


def attend_with_shared_tail(q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor,
                            k_tail: torch.Tensor, v_tail: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """Attention of G groups' queries over each group's own keys followed by keys every group
    shares: what ``dense_attention`` gives over the keys ``[own_g, tail]`` joined, without
    storing or reading the shared part once per group.

    Whisper's decoder is the case: the frames of a window past a segment's audio are a silent
    window's, the same for every segment of a batch, so each segment's K/V is read for its own
    frames only and the silent tail's once for all (an 8-segment layer of 300 own frames in
    1,500 reads a quarter of the bytes). The two score blocks share one softmax: each block's
    result is weighted by its share of the exponentials summed over both (on a CPU with AMX
    from each block's log-sum-exp, which torch's fused attention returns,
    `fused_cpu_attention`; elsewhere from each row's maximum over both and the exponentials
    summed in float32).

    Args:
        q: (G, R, H, D) each group's R query rows (any strides).
        k_own, v_own: (G, L, H, D) each group's own keys and values, views of head-major
            (G, H, L, D) storage (as `oasr.models.whisper.dense_kv.DecoderKv` holds them).
        k_tail, v_tail: (H, T, D) contiguous: the keys and values after every group's own.
        scale: score scale, default 1 / sqrt(D).
    Returns:
        (G, R, H, D) in q's dtype.
    """
    scale = scale if scale is not None else q.size(-1) ** -0.5
    if q.device.type == "cpu" and fused_cpu_attention():
        return _shared_tail_fused(q, k_own, v_own, k_tail, v_tail, scale)
    return _shared_tail_passes(q, k_own, v_own, k_tail, v_tail, scale)


def _shared_tail_fused(q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor,
                       k_tail: torch.Tensor, v_tail: torch.Tensor, scale: float) -> torch.Tensor:
    """`attend_with_shared_tail` on CPU: each block through torch's fused CPU attention, which
    also returns each query's log-sum-exp of its scores, and the two results weighted by their
    shares of the joined softmax (``exp(lse_block - lse_both)``), in float32. No score tensor is
    written: 8 segments of 300 own frames in 1,500 took 1.5 against 2.0 ms a layer with
    `_shared_tail_passes`, 600 frames 2.3 against 2.5, 1,000 frames 3.2 against 3.1 (one
    Sapphire Rapids core, bfloat16)."""
    groups, rows, heads, dim = q.shape
    qh = q.transpose(1, 2)  # (G, H, R, D)
    own, own_lse = _flash_cpu(qh, k_own.transpose(1, 2), v_own.transpose(1, 2),
                              scale=scale)[:2]  # (G, H, R, D), (G, H, R)
    q_tail = qh.transpose(0, 1).reshape(1, heads, groups * rows, dim)
    tail, tail_lse = _flash_cpu(q_tail, k_tail.unsqueeze(0), v_tail.unsqueeze(0),
                                scale=scale)[:2]  # (1, H, G R, D), (1, H, G R)
    tail = tail[0].view(heads, groups, rows, dim).transpose(0, 1)  # (G, H, R, D)
    tail_lse = tail_lse[0].view(heads, groups, rows).transpose(0, 1)  # (G, H, R)
    both = torch.logaddexp(own_lse, tail_lse)
    out = own.float().mul_(own_lse.sub_(both).exp_().unsqueeze(-1))
    out.addcmul_(tail.float(), tail_lse.sub_(both).exp_().unsqueeze(-1))
    return out.to(q.dtype).transpose(1, 2)  # (G, R, H, D)


def _shared_tail_passes(q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor,
                        k_tail: torch.Tensor, v_tail: torch.Tensor, scale: float) -> torch.Tensor:
    """`attend_with_shared_tail` in matmuls and element-wise passes (any device).

    The own blocks' products are batched over (group, head) or (head, group), whichever order
    the keys are stored in (a dense decoder buffer's (G, H, L, D), a paged read's (H, G, L,
    D)), so that no operand is copied into the other order first."""
    groups, rows, heads, dim = q.shape
    heads_first = k_own.stride(2) > k_own.stride(0)
    order = (2, 0, 1, 3) if heads_first else (0, 2, 1, 3)  # (G, L, H, D) -> its storage's

    def as_own(t: torch.Tensor) -> torch.Tensor:
        """(H, G, ...) -> the own blocks' batch order."""
        return t if heads_first else t.transpose(0, 1)

    qh = q.permute(order) * scale  # (H, G, R, D) or (G, H, R, D)
    own = torch.matmul(qh, k_own.permute(order).transpose(-2, -1)).float()  # (., ., R, L)
    q_tail = as_own(qh).reshape(heads, groups * rows, dim)  # (H, G R, D)
    tail = torch.matmul(q_tail, k_tail.transpose(-2, -1)).float()  # (H, G R, T)
    top = torch.maximum(own.amax(-1), as_own(tail.amax(-1).view(heads, groups, rows)))
    own = own.sub_(top.unsqueeze(-1)).exp_()
    tail = tail.sub_(as_own(top).reshape(heads, groups * rows, 1)).exp_()
    total = own.sum(-1) + as_own(tail.sum(-1).view(heads, groups, rows))
    out = torch.matmul(own.to(v_own.dtype), v_own.permute(order)).float()  # (., ., R, D)
    shared = torch.matmul(tail.to(v_tail.dtype), v_tail)  # (H, G R, D)
    out += as_own(shared.view(heads, groups, rows, dim))
    out /= total.unsqueeze(-1)
    back = (1, 2, 0, 3) if heads_first else (0, 2, 1, 3)
    return out.to(q.dtype).permute(back)  # (G, R, H, D)
