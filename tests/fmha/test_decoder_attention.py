"""Decoder attention over paged K/V equals dense attention over the same keys."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import oasr.fmha.decoder_attention as decoder_attention
import oasr.fmha.paged as paged
from oasr.fmha import PagedKVCache, dense_attention, write_chunk_kv
from oasr.fmha.decoder_attention import (
    _shared_tail_fused,
    _shared_tail_passes,
    attend_head_major,
    attend_with_shared_tail,
    causal_bias,
    decoder_cross_attention,
    decoder_self_attention,
    gather_pages_head_major,
)

H, D, PAGE = 2, 8, 4
TABLE = torch.tensor([[1, 3, 5, 0], [2, 4, 6, 0]], dtype=torch.int32)  # (B, W): rows' pages


def paged_rows(held: list[int], gen: torch.Generator):
    """A pool whose two rows hold ``held`` random tokens; returns it and the tokens."""
    k_pool, v_pool = torch.zeros(8, PAGE, H, D), torch.zeros(8, PAGE, H, D)
    keys = [torch.randn(1, n, H, D, generator=gen) for n in held]
    values = [torch.randn(1, n, H, D, generator=gen) for n in held]
    for b in range(len(held)):
        row = PagedKVCache(k_pool, v_pool, TABLE[b : b + 1], torch.zeros(1, dtype=torch.int32),
                           PAGE, 0)
        write_chunk_kv(row, keys[b], values[b])
    return k_pool, v_pool, keys, values


def test_self_attention_stores_then_attends_causally_per_row() -> None:
    gen = torch.Generator().manual_seed(0)
    held = [5, 2]  # rows hold different numbers of tokens
    k_pool, v_pool, keys, values = paged_rows(held, gen)
    q, k, v = (torch.randn(2, 3, H, D, generator=gen) for _ in range(3))  # (B, T, H, D)
    lens = torch.tensor(held, dtype=torch.int32)
    out = decoder_self_attention(q, k, v, PagedKVCache(k_pool, v_pool, TABLE, lens, PAGE, 5))
    for b, n in enumerate(held):
        all_k = torch.cat([keys[b], k[b : b + 1]], dim=1)  # (1, n + 3, H, D)
        all_v = torch.cat([values[b], v[b : b + 1]], dim=1)
        valid = torch.ones(1, n + 3, dtype=torch.bool)
        want = dense_attention(q[b : b + 1], all_k, all_v, valid,
                               causal_bias(torch.tensor([n]), 3, n + 3))
        torch.testing.assert_close(out[b : b + 1], want, atol=1e-5, rtol=1e-5)


def test_cross_attention_reads_each_rows_frames_only() -> None:
    gen = torch.Generator().manual_seed(1)
    held = [7, 3]
    k_pool, v_pool, keys, values = paged_rows(held, gen)
    lens = torch.tensor(held, dtype=torch.int32)
    cache = PagedKVCache(k_pool, v_pool, TABLE, lens, PAGE, 7)
    gathered_k, gathered_v = gather_pages_head_major(cache, 8, torch.float32)  # (H, B, 8, D)
    q = torch.randn(2, 2, H, D, generator=gen)
    out = decoder_cross_attention(q, gathered_k, gathered_v, lens)
    for b, n in enumerate(held):
        want = dense_attention(q[b : b + 1], keys[b], values[b], torch.ones(1, n, dtype=torch.bool))
        torch.testing.assert_close(out[b : b + 1], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_attention_over_full_rows_equals_the_masked_path(dtype: torch.dtype) -> None:
    """Rows that hold every gathered frame attend unmasked (the faster path, taken with a head
    dim of 16: a power-of-two scale): the same result as masking nothing, and a row holding
    fewer frames still masks them."""
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(H, 2, 8, 16, generator=gen).to(dtype)
    values = torch.randn(H, 2, 8, 16, generator=gen).to(dtype)
    q = torch.randn(2, 1, H, 16, generator=gen).to(dtype)
    full = torch.tensor([8, 8])
    out = decoder_cross_attention(q, keys, values, full)
    masked = attend_head_major(q, keys, values, torch.ones(2, 8, dtype=torch.bool))
    torch.testing.assert_close(out, masked, atol=1e-2 if dtype == torch.bfloat16 else 0, rtol=0)
    short = decoder_cross_attention(q, keys, values, torch.tensor([8, 5]))
    torch.testing.assert_close(short[:1], out[:1], atol=1e-2 if dtype == torch.bfloat16 else 0,
                               rtol=0)
    want = attend_head_major(q[1:], keys[:, 1:, :5], values[:, 1:, :5],
                             torch.ones(1, 5, dtype=torch.bool))
    torch.testing.assert_close(short[1:], want, atol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               rtol=0)


@pytest.mark.parametrize("heads_first", [False, True], ids=["group-major", "head-major"])
@pytest.mark.parametrize("attend", [_shared_tail_fused, _shared_tail_passes],
                         ids=["fused", "passes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_tail_attention_is_attention_over_the_joined_keys(dtype: torch.dtype,
                                                                 attend: Callable,
                                                                 heads_first: bool) -> None:
    """Each group's query rows over its own keys and then keys every group shares: one softmax
    over both blocks (not one per block), as dense attention over the keys joined; through the
    fused kernel's log-sum-exps (CPUs with AMX) and in the passes (other CPUs and devices),
    with the own keys stored per group (a dense decoder buffer) or per head (a paged read)."""
    gen = torch.Generator().manual_seed(3)
    groups, rows, own, tail, dim = 3, 5, 7, 11, 16
    q = torch.randn(groups, H, rows, dim, generator=gen).to(dtype).transpose(1, 2)  # strided
    k_own = torch.randn(groups, H, own, dim, generator=gen).to(dtype)
    v_own = torch.randn(groups, H, own, dim, generator=gen).to(dtype)
    k_tail = torch.randn(H, tail, dim, generator=gen).to(dtype)
    v_tail = torch.randn(H, tail, dim, generator=gen).to(dtype)
    if heads_first:  # (H, G, L, D) storage, viewed (G, L, H, D)
        k_view = k_own.transpose(0, 1).contiguous().permute(1, 2, 0, 3)
        v_view = v_own.transpose(0, 1).contiguous().permute(1, 2, 0, 3)
        assert k_view.stride(2) > k_view.stride(0)
    else:  # (G, H, L, D) storage
        k_view, v_view = k_own.transpose(1, 2), v_own.transpose(1, 2)
    got = attend(q, k_view, v_view, k_tail, v_tail, scale=dim ** -0.5)
    assert got.shape == (groups, rows, H, dim) and got.dtype == dtype
    keys = torch.cat([k_own, k_tail.expand(groups, -1, -1, -1)], dim=2).transpose(1, 2)
    values = torch.cat([v_own, v_tail.expand(groups, -1, -1, -1)], dim=2).transpose(1, 2)
    want = dense_attention(q.float(), keys.float(), values.float(), None)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=0)
    # the tail's keys count: without them the answer is another
    alone = dense_attention(q.float(), k_own.transpose(1, 2).float(),
                            v_own.transpose(1, 2).float(), None)
    assert (alone - want).abs().max() > 10 * tol


@pytest.mark.parametrize("fused", [False, True], ids=["matmuls", "fused"])
def test_lone_queries_attend_alike_through_either_cpu_path(monkeypatch: pytest.MonkeyPatch,
                                                           fused: bool) -> None:
    """A decoder's lone queries (its next token) over its keys, masked or not, and over a
    shared tail: the fused kernel (CPUs with AMX) and the matmuls (other CPUs) give the float32
    reference's answer."""
    monkeypatch.setattr(paged, "fused_cpu_attention", lambda: fused)
    monkeypatch.setattr(decoder_attention, "fused_cpu_attention", lambda: fused)
    gen = torch.Generator().manual_seed(4)
    dtype, dim = torch.bfloat16, 16
    q = torch.randn(3, 1, H, dim, generator=gen).to(dtype)
    keys = torch.randn(3, 9, H, dim, generator=gen).to(dtype)
    values = torch.randn(3, 9, H, dim, generator=gen).to(dtype)
    valid = torch.arange(9) < torch.tensor([[9], [6], [2]])
    for keep in (None, valid):
        got = dense_attention(q, keys, values, keep)
        want = dense_attention(q.float(), keys.float(), values.float(), keep)
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=0)
    k_tail = torch.randn(H, 5, dim, generator=gen).to(dtype)
    v_tail = torch.randn(H, 5, dim, generator=gen).to(dtype)
    got = attend_with_shared_tail(q, keys, values, k_tail, v_tail)
    joined_k = torch.cat([keys, k_tail.transpose(0, 1).expand(3, -1, -1, -1)], dim=1)
    joined_v = torch.cat([values, v_tail.transpose(0, 1).expand(3, -1, -1, -1)], dim=1)
    want = dense_attention(q.float(), joined_k.float(), joined_v.float(), None)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=0)
