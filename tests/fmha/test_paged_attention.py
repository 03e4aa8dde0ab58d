"""Paged attention equals dense attention over the same keys, for every backend."""

import math

import pytest
import torch

from oasr.fmha import (
    ATTN_BACKENDS,
    GatherWorkspace,
    PagedKVCache,
    default_backend,
    dense_attention,
    gather_kv,
    gather_length,
    key_padding_mask,
    paged_attention,
    resolve_backend,
    write_chunk_kv,
)

HEADS, DIM, BLOCK = 2, 8, 4


def _scatter_rows(history: list[torch.Tensor], num_blocks: int, max_blocks: int, seed: int):
    """Put each row's history into shuffled physical blocks; return pools and a block table."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    # unowned blocks hold other streams' data: reading one would change the result
    k_pool = torch.randn((num_blocks, BLOCK, HEADS, DIM), generator=gen) * 100
    v_pool = torch.randn((num_blocks, BLOCK, HEADS, DIM), generator=gen) * 100
    table = torch.zeros(len(history), max_blocks, dtype=torch.int32)
    for row, kv in enumerate(history):
        frames = kv.size(1)
        for logical in range(math.ceil((frames + BLOCK) / BLOCK)):
            phys = order.pop()
            table[row, logical] = phys
            part = kv[:, logical * BLOCK : (logical + 1) * BLOCK]
            k_pool[phys, : part.size(1)] = part[0]
            v_pool[phys, : part.size(1)] = part[1]
    return k_pool, v_pool, table


# float32 within float32 rounding; bfloat16 (inputs rounded, float32 accumulation) against
# the float32 maths of the same rounded inputs, within one bfloat16 rounding of the output
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("backend", ATTN_BACKENDS)
def test_paged_equals_dense_mixed_lengths(backend: str, with_bias: bool,
                                          dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    hist_lens = [0, 3, 8, 13]
    chunk, q_lens = 4, torch.tensor([4, 4, 2, 4])
    history = [torch.randn(2, n, HEADS, DIM).to(dtype) for n in hist_lens]
    k_pool, v_pool, table = _scatter_rows(history, num_blocks=16, max_blocks=6, seed=1)
    k_pool, v_pool = k_pool.to(dtype), v_pool.to(dtype)
    cache = PagedKVCache(
        k_pool, v_pool, table, torch.tensor(hist_lens, dtype=torch.int32), BLOCK, max(hist_lens)
    )
    # q a strided view of a fused projection, as the models pass it
    q = torch.randn(4, chunk, 3, HEADS, DIM).to(dtype)[:, :, 0]
    k_new = torch.randn(4, chunk, HEADS, DIM).to(dtype)
    v_new = torch.randn(4, chunk, HEADS, DIM).to(dtype)
    write_chunk_kv(cache, k_new, v_new)
    length = gather_length(cache, chunk)
    bias = torch.randn(4, HEADS, chunk, length).to(dtype) if with_bias else None
    out = paged_attention(q, cache, q_lens=q_lens, attn_bias=bias, backend=backend)
    assert out.dtype == dtype and out.shape == q.shape

    for row, n in enumerate(hist_lens):
        m = int(q_lens[row])
        k = torch.cat([history[row][0], k_new[row, :m]]).unsqueeze(0).float()  # (1, n+m, H, D)
        v = torch.cat([history[row][1], v_new[row, :m]]).unsqueeze(0).float()
        valid = torch.ones(1, n + m, dtype=torch.bool)
        row_bias = None if bias is None else bias[row : row + 1, :, :, : n + m].float()
        ref = dense_attention(q[row : row + 1].float(), k, v, valid, row_bias)
        torch.testing.assert_close(out[row : row + 1, :m].float(), ref[:, :m],
                                   atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ATTN_BACKENDS)
def test_a_row_with_no_key_stays_finite(backend: str, dtype: torch.dtype) -> None:
    """An empty stream's padded chunk (no history, no valid frame) attends nothing: its
    output is ignored but must be finite (the next layer writes it into the pool as K/V)."""
    torch.manual_seed(5)
    pool = torch.randn(4, BLOCK, HEADS, DIM).to(dtype)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cache = PagedKVCache(pool, pool.clone(), table, torch.tensor([0, 3], dtype=torch.int32),
                         BLOCK, 3)
    q = torch.randn(2, 2, HEADS, DIM).to(dtype)
    out = paged_attention(q, cache, q_lens=torch.tensor([0, 2]), backend=backend)
    assert torch.isfinite(out).all()


def test_write_lands_at_block_slots() -> None:
    k_pool = torch.zeros(8, BLOCK, 1, 1)
    v_pool = torch.zeros(8, BLOCK, 1, 1)
    table = torch.tensor([[5, 2, 0], [7, 0, 0]], dtype=torch.int32)
    cache = PagedKVCache(k_pool, v_pool, table, torch.tensor([3, 0], dtype=torch.int32), BLOCK, 3)
    k = torch.arange(1.0, 7.0).view(2, 3, 1, 1)
    write_chunk_kv(cache, k, -k)
    # row 0 frames 3, 4, 5 -> block 5 slot 3, block 2 slots 0 and 1 (a chunk spans two blocks)
    assert k_pool[5, 3, 0, 0] == 1.0 and k_pool[2, 0, 0, 0] == 2.0 and k_pool[2, 1, 0, 0] == 3.0
    # row 1 frames 0, 1, 2 -> block 7 slots 0..2
    assert k_pool[7, :3, 0, 0].tolist() == [4.0, 5.0, 6.0]
    assert v_pool[7, :3, 0, 0].tolist() == [-4.0, -5.0, -6.0]
    assert int((k_pool != 0).sum()) == 6


def test_gather_length_is_whole_blocks_capped_by_table() -> None:
    pool = torch.zeros(4, BLOCK, 1, 1)
    cache = PagedKVCache(pool, pool, torch.zeros(1, 3, dtype=torch.int32),
                         torch.tensor([5], dtype=torch.int32), BLOCK, 5)
    assert gather_length(cache, 2) == 8
    assert gather_length(cache, 4) == 12
    assert gather_length(cache, 40) == 12


def test_key_padding_mask() -> None:
    mask = key_padding_mask(torch.tensor([0, 2, 4]), 4)
    assert mask.tolist() == [[False] * 4, [True, True, False, False], [True] * 4]


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_no_key_mask_is_every_key_real(backend: str) -> None:
    """``valid=None`` (a dense decoder cache: every key real) is the all-true mask, with a
    bias or without, and differs from masking one key."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, 8, generator=g)
    k, v = torch.randn(2, 6, 4, 8, generator=g), torch.randn(2, 6, 4, 8, generator=g)
    everything = torch.ones(2, 6, dtype=torch.bool)
    bias = torch.randn(2, 4, 3, 6, generator=g)
    for extra in (None, bias):
        torch.testing.assert_close(dense_attention(q, k, v, None, extra, backend=backend),
                                   dense_attention(q, k, v, everything, extra, backend=backend))
    one_masked = everything.clone()
    one_masked[:, 2] = False
    assert not torch.allclose(dense_attention(q, k, v, None, backend=backend),
                              dense_attention(q, k, v, one_masked, backend=backend))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [16, 64, 24])
def test_unmasked_attention_is_the_masked_softmax(dim: int, dtype: torch.dtype) -> None:
    """With no key to mask and a power-of-two scale (head dims 16 and 64) the ``torch`` backend
    folds the scale into the queries and runs the softmax in the operands' dtype: float32 gives
    the masked path's result exactly, bfloat16 within a rounding of it; a scale that is not a
    power of two (dim 24) keeps the masked path. A scale left out, or applied twice, fails."""
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(3, 2, 4, dim, generator=g) * 2).to(dtype)
    k, v = (torch.randn(3, 40, 4, dim, generator=g).to(dtype) for _ in range(2))
    everything = torch.ones(3, 40, dtype=torch.bool)
    fast, masked = dense_attention(q, k, v, None), dense_attention(q, k, v, everything)
    if dtype == torch.float32:
        assert torch.equal(fast, masked)
    else:
        torch.testing.assert_close(fast, masked, atol=2e-2, rtol=2e-2)
    scores = torch.einsum("bthd,blhd->bhtl", q.double(), k.double()) / math.sqrt(dim)
    reference = torch.einsum("bhtl,blhd->bthd", scores.softmax(-1), v.double())
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fast.double(), reference, atol=tolerance, rtol=tolerance)


def test_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OASR_ATTN_BACKEND", raising=False)
    # the measured rule: the fused kernel for every float dtype on CPU; CUDA keeps torch
    for dtype in (torch.float32, torch.bfloat16):
        assert resolve_backend(dtype=dtype) == default_backend("cpu", dtype) == "sdpa"
    assert resolve_backend(dtype=torch.float16, device_type="cuda") == "torch"
    assert resolve_backend() == "torch"  # dtype unknown: the reference
    monkeypatch.setenv("OASR_ATTN_BACKEND", "")  # empty is unset
    assert resolve_backend(dtype=torch.bfloat16) == "sdpa"
    monkeypatch.setenv("OASR_ATTN_BACKEND", "torch")  # the environment overrides the rule
    assert resolve_backend(dtype=torch.bfloat16) == "torch"
    monkeypatch.setenv("OASR_ATTN_BACKEND", "sdpa")
    assert resolve_backend() == "sdpa"
    assert resolve_backend("torch") == "torch"
    monkeypatch.setenv("OASR_ATTN_BACKEND", "flash")
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        resolve_backend()


def test_write_rejects_mismatched_shapes() -> None:
    pool = torch.zeros(2, BLOCK, 1, 2)
    cache = PagedKVCache(pool, pool, torch.zeros(1, 2, dtype=torch.int32),
                         torch.zeros(1, dtype=torch.int32), BLOCK, 0)
    with pytest.raises(ValueError, match="k and v shapes differ"):
        write_chunk_kv(cache, torch.zeros(1, 2, 1, 2), torch.zeros(1, 3, 1, 2))
    with pytest.raises(ValueError, match="chunk has 2 rows, block table has 1"):
        write_chunk_kv(cache, torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2))


def test_gather_head_major_equals_indexing_then_transposing() -> None:
    from oasr.fmha import gather_head_major

    table = torch.randn(11, 3, 5)
    index = torch.tensor([[4, 5, 6, 10], [0, 0, 9, 1]])
    out = gather_head_major(table, index)
    assert out.shape == (3, 2, 4, 5) and out.is_contiguous()
    assert torch.equal(out, table[index].permute(2, 0, 1, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_sharing_a_gather_workspace_attend_their_own_keys(dtype: torch.dtype) -> None:
    """Layers of a step gather into one workspace one after another: each layer's result is
    the one it gets with fresh tensors, and a step of the same size reuses the buffers."""
    torch.manual_seed(3)
    hist_lens = [5, 11, 0]
    workspace = GatherWorkspace()
    layers = []
    for seed in (1, 2):  # two layers: their pools hold different keys
        history = [torch.randn(2, n, HEADS, DIM) for n in hist_lens]
        k_pool, v_pool, table = _scatter_rows(history, num_blocks=16, max_blocks=5, seed=seed)
        layers.append((k_pool.to(dtype), v_pool.to(dtype), table))
    q = torch.randn(3, BLOCK, HEADS, DIM).to(dtype)
    seqlens = torch.tensor(hist_lens, dtype=torch.int32)

    def step(with_workspace: bool) -> list[torch.Tensor]:
        outs = []
        for k_pool, v_pool, table in layers:
            cache = PagedKVCache(k_pool, v_pool, table, seqlens, BLOCK, max(hist_lens),
                                 workspace=workspace if with_workspace else None)
            outs.append(paged_attention(q, cache, backend="sdpa"))
        return outs

    fresh = step(False)
    shared = step(True)
    held = workspace.nbytes
    pointers = [b.data_ptr() for b in workspace._buffers if b is not None]
    again = step(True)
    for a, b, c in zip(fresh, shared, again, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(fresh[0], fresh[1])  # the layers' keys differ
    assert held > 0 and workspace.nbytes == held
    assert [b.data_ptr() for b in workspace._buffers if b is not None] == pointers


def test_a_gather_workspace_grows_to_the_largest_gather() -> None:
    pool = torch.arange(8 * BLOCK * HEADS * DIM, dtype=torch.float32).view(8, BLOCK, HEADS, DIM)
    workspace = GatherWorkspace()
    small = PagedKVCache(pool, pool, torch.tensor([[3, 1]], dtype=torch.int32),
                         torch.tensor([2], dtype=torch.int32), BLOCK, 2, workspace=workspace)
    k, _ = gather_kv(small, BLOCK)
    assert torch.equal(k[0], pool[3])
    big = PagedKVCache(pool, pool, torch.tensor([[5, 6], [7, 2]], dtype=torch.int32),
                       torch.tensor([5, 5], dtype=torch.int32), BLOCK, 5, workspace=workspace)
    k, v = gather_kv(big, 2 * BLOCK)
    assert torch.equal(k, torch.cat([pool[[5, 6]], pool[[7, 2]]]).view(2, 2 * BLOCK, HEADS, DIM))
    assert torch.equal(v, k)
    assert workspace.nbytes == 2 * 4 * BLOCK * HEADS * DIM * 4  # keys and values, 4 blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_a_lone_query_attends_as_the_reference(dtype: torch.dtype, masked: bool) -> None:
    """A decoder's next token (one query per row and head; torch's fused kernel on CPU) over
    keys read through a strided view, as a decoder's K/V buffer holds them: the float64
    softmax of the scaled scores, with the masked keys out (they hold huge values, so one
    read would show), and a row with no key left as the torch backend gives it (finite)."""
    g = torch.Generator().manual_seed(11)
    rows, length, heads, dim = 4, 30, 3, 64
    q = torch.randn(rows, 1, heads, dim, generator=g).to(dtype)
    storage = torch.randn(2, rows, heads, 48, dim, generator=g).to(dtype)  # (K|V, B, H, cap, D)
    k, v = (storage[i, :, :, :length].transpose(1, 2) for i in range(2))  # (B, L, H, D) views
    valid = None
    if masked:
        valid = torch.arange(length)[None, :] < torch.tensor([30, 17, 1, 9])[:, None]
        k, v = (x.masked_fill(~valid[:, :, None, None], 1e4) for x in (k, v))
    out = dense_attention(q, k, v, valid)
    scores = torch.einsum("bthd,blhd->bhtl", q.double(), k.double()) / math.sqrt(dim)
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    reference = torch.einsum("bhtl,blhd->bthd", scores.softmax(-1), v.double())
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), reference, atol=tolerance, rtol=tolerance)
    if masked:  # every key of row 2 but its first masked too: no key at all, as the torch passes
        nothing = valid.clone()
        nothing[2] = False
        lone = dense_attention(q, k, v, nothing)
        two = dense_attention(torch.cat([q, q], dim=1), k, v, nothing)[:, :1]  # the passes
        assert torch.isfinite(lone).all()
        torch.testing.assert_close(lone, two, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_passes_no_mask_when_every_row_holds_every_key(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """A steady batch (every row's history fills the gathered window) needs no key mask; one
    short row brings it back. Both equal the dense reference."""
    import torch.nn.functional as F

    masks: list[torch.Tensor | None] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(7)
    chunk = BLOCK
    for hist_lens, masked in (([8, 8, 8], False), ([8, 3, 8], True)):
        history = [torch.randn(2, n, HEADS, DIM).to(dtype) for n in hist_lens]
        k_pool, v_pool, table = _scatter_rows(history, num_blocks=12, max_blocks=3, seed=2)
        cache = PagedKVCache(k_pool.to(dtype), v_pool.to(dtype), table,
                             torch.tensor(hist_lens, dtype=torch.int32), BLOCK, max(hist_lens))
        q = torch.randn(3, chunk, HEADS, DIM).to(dtype)
        k_new, v_new = (torch.randn(3, chunk, HEADS, DIM).to(dtype) for _ in range(2))
        write_chunk_kv(cache, k_new, v_new)
        masks.clear()
        out = paged_attention(q, cache, backend="sdpa")
        assert len(masks) == 1 and (masks[0] is not None) == masked
        for row in range(len(hist_lens)):
            k = torch.cat([history[row][0], k_new[row]]).unsqueeze(0).float()
            v = torch.cat([history[row][1], v_new[row]]).unsqueeze(0).float()
            ref = dense_attention(q[row : row + 1].float(), k, v, None)
            torch.testing.assert_close(out[row : row + 1].float(), ref, atol=TOLERANCE[dtype],
                                       rtol=0)
