"""Paged attention: write a chunk's K/V into the block pool and attend through block tables.

A batch row (one stream) spans ``cache_seqlens[b]`` frames in the shared pool. Frame ``p`` of
the row lives in physical block ``block_table[b, p // block_size]`` at slot ``p % block_size``.
Frames before ``cache_starts[b]`` (when given) were evicted from the row's first block and are
not attended to; the history is frames ``cache_starts[b] .. cache_seqlens[b] - 1``. A chunk's
K/V is written first (frames ``cache_seqlens[b] + t``), then every query of the chunk attends
to the row's history plus the whole chunk: the chunk mask of a streaming Conformer (full
attention inside a chunk, causal across chunks).

Rows of one batch may hold different amounts of history: the gather is sized by the host-side
upper bound ``host_seqlen`` and the surplus columns are masked, so no device value is read back
to the host on the hot path.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from oasr import cpu

ATTN_BACKENDS = ("torch", "sdpa")
ATTN_BACKEND_ENV = "OASR_ATTN_BACKEND"


@dataclass
class PagedKVCache:
    """One layer's view of the block pool for one batch of streams.

    Attributes:
        k_cache: (num_physical_blocks, block_size, n_kv_head, head_dim) keys of every block.
        v_cache: same shape, values.
        block_table: (B, max_blocks_per_seq) int32, logical block -> physical block id.
        cache_seqlens: (B,) int32, frames each row spans before the current chunk (its
            history, plus the evicted frames before it in its first block).
        block_size: frames per block.
        host_seqlen: host-side upper bound of ``cache_seqlens`` (sizes gathers without a sync).
        cache_starts: (B,) int32, the row's first frame of history (0 <= start < block_size:
            eviction by frame leaves the first block partly valid); None when every row's
            history starts at frame 0.
        workspace: where ``gather_kv`` puts the gathered rows on CPU (shared by the layers of
            one step, which attend one after another); None: fresh tensors each call.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    block_size: int
    host_seqlen: int
    cache_starts: torch.Tensor | None = None
    workspace: GatherWorkspace | None = None

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_table.size(1)


class GatherWorkspace:
    """Two buffers that a step's gathered keys and values are written into, layer after layer
    and step after step, instead of two new tensors per layer.

    At 512 streams a layer's gathered keys are 63 MiB (bfloat16, 160 frames of 6 x 64). A
    fresh tensor that size is a fresh ``mmap`` on a thread other than the main one, whatever
    the allocator settings (`oasr.engine.runner.host_memory`), and its pages are faulted in
    and zeroed before the gather writes them: 20 ms against 3 ms into a buffer written
    before, on a 2-vCPU Sapphire Rapids Xeon. The buffers grow to the largest gather seen
    and stay; a gather's result is valid until the next gather from the same workspace.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None, None]

    def take(self, which: int, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A tensor of ``shape`` with ``like``'s dtype and device in buffer ``which`` (0: keys,
        1: values), its old contents left in it."""
        numel = math.prod(shape)
        buffer = self._buffers[which]
        if (buffer is None or buffer.numel() < numel or buffer.dtype != like.dtype
                or buffer.device != like.device):
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[which] = buffer
        return buffer[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes the buffers hold."""
        return sum(b.numel() * b.element_size() for b in self._buffers if b is not None)


def default_backend(device_type: str, dtype: torch.dtype | None) -> str:
    """The backend ``paged_attention`` uses when neither an argument nor the environment names
    one: ``sdpa`` for float32 and bfloat16 on CPU, ``torch`` elsewhere.

    Measured with `bench/attention_backends.py` (one thread, 6 heads of 64, 32-frame chunks
    over 128 or 448 cached frames, 4 to 64 streams, the backends alternated call by call) on a
    2-vCPU Sapphire Rapids Xeon (AMX-bf16, AVX512-bf16): sdpa took 1.5-3.9x less time than
    torch in bfloat16 and 1.2-1.6x less in float32 (one tie, 64 streams over 448 frames); with
    the same CPU held to AVX2 (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``) float32
    sdpa took 1.1-1.4x less. Whole 64-stream engine steps, the backends alternated step by step
    (process CPU time): Whisper-CTC 1.32x faster with sdpa in bfloat16, 1.07x in float32 (also
    1.07x held to AVX2); the Conformer (float32, a full relative-position bias as the mask) 0.99x
    and 1.04x held to AVX2, a tie. CUDA (and float16 on CPU) keeps ``torch``: not measured yet.

    Args:
        device_type: ``cpu``, ``cuda``, ...
        dtype: the queries' dtype; None (unknown) keeps the reference, ``torch``.
    """
    if device_type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        return "sdpa"
    return "torch"


def resolve_backend(name: str | None = None, dtype: torch.dtype | None = None,
                    device_type: str = "cpu") -> str:
    """The attention backend to use: ``name``, else ``$OASR_ATTN_BACKEND``, else
    `default_backend` for ``device_type`` and ``dtype``.

    Raises:
        ValueError: for an unknown backend name.
    """
    from_env = os.environ.get(ATTN_BACKEND_ENV) or None
    chosen = name if name is not None else from_env
    if chosen is None:
        return default_backend(device_type, dtype)
    if chosen not in ATTN_BACKENDS:
        raise ValueError(
            f"unknown attention backend {chosen!r} (from {'argument' if name else ATTN_BACKEND_ENV}); "
            f"choose one of {', '.join(ATTN_BACKENDS)}"
        )
    return chosen


def gather_length(cache: PagedKVCache, num_query_frames: int) -> int:
    """Key columns ``paged_attention`` gathers for a chunk of ``num_query_frames`` frames.

    A whole number of blocks covering the longest row's history plus the chunk, capped at what
    the block table can address. Callers that build an ``attn_bias`` size its last dim with this.
    """
    needed = cache.host_seqlen + num_query_frames
    num_blocks = min(math.ceil(needed / cache.block_size), cache.max_blocks_per_seq)
    return num_blocks * cache.block_size


def _chunk_slots(cache: PagedKVCache, num_frames: int) -> torch.Tensor:
    """Flat pool slots (B * T,) of frames ``cache_seqlens[b] + t`` for t < num_frames."""
    steps = torch.arange(num_frames, device=cache.block_table.device)
    positions = cache.cache_seqlens.long().unsqueeze(1) + steps  # (B, T)
    logical = positions // cache.block_size
    physical = cache.block_table.long().gather(1, logical)  # (B, T)
    return (physical * cache.block_size + positions % cache.block_size).reshape(-1)


def write_chunk_kv(cache: PagedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store a chunk's keys and values at each row's next frames.

    Args:
        cache: the layer's paged view; rows must own blocks for frames
            ``cache_seqlens[b] .. cache_seqlens[b] + T - 1`` (``prepare_chunk`` allocates them).
        k: (B, T, n_kv_head, head_dim) keys of the chunk.
        v: (B, T, n_kv_head, head_dim) values of the chunk.
    """
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    batch, frames, heads, dim = k.shape
    if batch != cache.block_table.size(0):
        raise ValueError(f"chunk has {batch} rows, block table has {cache.block_table.size(0)}")
    slots = _chunk_slots(cache, frames)  # (B * T,)
    k_flat = cache.k_cache.view(-1, heads, dim)  # (num_blocks * block_size, H, D)
    v_flat = cache.v_cache.view(-1, heads, dim)
    k_flat.index_copy_(0, slots, k.reshape(-1, heads, dim).to(k_flat.dtype))
    v_flat.index_copy_(0, slots, v.reshape(-1, heads, dim).to(v_flat.dtype))


def gather_kv(cache: PagedKVCache, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the first ``length`` frames (a whole number of blocks) of every row.

    One ``index_select`` of whole blocks per tensor (each block is contiguous in the pool, so
    this is a few large copies, not one per frame), landing token-major: (B, L, H, D), whose
    ``transpose(1, 2)`` is the (B, H, L, D) view ``scaled_dot_product_attention`` reads as is.

    Returns:
        k, v: (B, length, n_kv_head, head_dim); columns past a row's length hold stale data.
        On CPU with the cache's ``workspace`` they are views of it, valid until its next
        gather.
    """
    num_blocks = length // cache.block_size
    ids = cache.block_table[:, :num_blocks].reshape(-1).long()  # (B * nb,)
    batch = cache.block_table.size(0)
    shape = (batch, length, *cache.k_cache.shape[2:])  # (B, L, H, D)
    workspace = cache.workspace if cache.k_cache.device.type == "cpu" else None
    if workspace is None:
        return (cache.k_cache.index_select(0, ids).view(shape),
                cache.v_cache.index_select(0, ids).view(shape))
    blocks = (ids.numel(), *cache.k_cache.shape[1:])
    k = torch.index_select(cache.k_cache, 0, ids, out=workspace.take(0, blocks, cache.k_cache))
    v = torch.index_select(cache.v_cache, 0, ids, out=workspace.take(1, blocks, cache.v_cache))
    return k.view(shape), v.view(shape)


def key_padding_mask(kv_lens: torch.Tensor, length: int) -> torch.Tensor:
    """(B, length) bool, True where column j < kv_lens[b] (a real key)."""
    return torch.arange(length, device=kv_lens.device).unsqueeze(0) < kv_lens.unsqueeze(1)


def gather_head_major(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``table[index]`` laid out head-major for batched matmuls, in one gather.

    ``table[index]`` would be (B, L, H, D), and a matmul over heads would copy it again into
    (H, B, L, D). Reading the table as (N * H, D) instead and gathering rows ``index * H + h``
    gives the head-major result directly, and only the gathered rows are read (indexing the
    transposed (H, N, D) view would first copy the whole table, i.e. the whole pool).

    Args:
        table: (N, H, D) contiguous, e.g. one layer's pool frames or a position table.
        index: (B, L) int64 row numbers in [0, N).
    Returns:
        (H, B, L, D) contiguous.
    """
    num_rows, heads, dim = table.shape
    head = torch.arange(heads, device=index.device).unsqueeze(1)  # (H, 1)
    rows = index.reshape(1, -1) * heads + head  # (H, B * L)
    out = table.reshape(num_rows * heads, dim).index_select(0, rows.reshape(-1))
    return out.view(heads, *index.shape, dim)


def gather_kv_head_major(cache: PagedKVCache, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``gather_kv`` laid out for batched matmuls: one gather per tensor, no transpose copy.

    Returns:
        k, v: (n_kv_head, B, length, head_dim); columns past a row's length hold stale data.
    """
    num_blocks = length // cache.block_size
    ids = cache.block_table[:, :num_blocks].long()  # (B, nb)
    within = torch.arange(cache.block_size, device=ids.device)
    slots = (ids.unsqueeze(-1) * cache.block_size + within).reshape(ids.size(0), length)  # (B, L)
    heads, dim = cache.k_cache.shape[2:]
    k = gather_head_major(cache.k_cache.view(-1, heads, dim), slots)  # (H, B, L, D)
    v = gather_head_major(cache.v_cache.view(-1, heads, dim), slots)
    return k, v


def paged_attention(
    q: torch.Tensor,
    cache: PagedKVCache,
    q_lens: torch.Tensor | None = None,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Attention of a chunk's queries over each row's history plus the chunk.

    Args:
        q: (B, T, n_head, head_dim) queries (n_head == n_kv_head); any strides with a
            contiguous last dim (e.g. a view of a fused QKV projection).
        cache: the layer's paged view, with this chunk already written by ``write_chunk_kv``.
        q_lens: (B,) valid frames of each row's chunk (a stream's last chunk may be short);
            None means all T.
        attn_bias: optional (B, n_head, T, gather_length(cache, T)) added to the scaled scores.
        scale: score scale, default 1 / sqrt(head_dim).
        backend: ``torch`` or ``sdpa``; None reads ``$OASR_ATTN_BACKEND``, else
            `default_backend` for q's device and dtype.

    Returns:
        (B, T, n_head, head_dim) attention output. Padded query rows (t >= q_lens[b]) hold
        finite values the caller ignores.

    ``sdpa`` is one fused call: the rows' blocks gathered token-major (`gather_kv`) and read
    through transposed views, a (B, 1, 1, L) key mask, no score tensor; on CPU, when every row
    holds all L keys (a steady batch, its history full), no mask at all (at 512 streams the
    kernel took 25.0 against 26.3 ms a layer with an all-keep mask). ``torch`` is the
    reference: head-major gathers, float32 scores, a masked softmax.
    """
    batch, frames, _, dim = q.shape
    length = gather_length(cache, frames)
    scale = scale if scale is not None else 1.0 / math.sqrt(dim)
    new_frames = q_lens if q_lens is not None else torch.full_like(cache.cache_seqlens, frames)
    valid = key_padding_mask(cache.cache_seqlens + new_frames, length)  # (B, L)
    if cache.cache_starts is not None:  # frames evicted from the first block
        valid &= ~key_padding_mask(cache.cache_starts, length)
    if resolve_backend(backend, q.dtype, q.device.type) == "sdpa":
        k, v = gather_kv(cache, length)  # (B, L, H, D)
        # asking whether every key is real is free on CPU; on CUDA it would wait for the device
        every = q.device.type == "cpu" and bool(valid.all())
        keep = None if every else valid[:, None, None, :]
        mask = _sdpa_mask(keep, attn_bias, q.dtype)  # (B, 1|H, 1|T, L), or None
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype),
            attn_mask=mask, scale=scale)  # (B, H, T, D)
        return out.transpose(1, 2)  # (B, T, H, D)
    k, v = gather_kv_head_major(cache, length)  # (H, B, L, D)
    qh = q.permute(2, 0, 1, 3)  # (H, B, T, D)
    bias = attn_bias.transpose(0, 1) if attn_bias is not None else None  # (H, B, T, L)
    out = _masked_attention(qh, k.to(q.dtype), v.to(q.dtype), valid[None, :, None, :], bias,
                            scale, "torch")  # (H, B, T, D)
    return out.permute(1, 2, 0, 3)  # (B, T, H, D)


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    valid: torch.Tensor | None,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "torch",
) -> torch.Tensor:
    """Masked attention over contiguous keys; the reference the paged path must equal.

    Args:
        q: (B, T, H, D); k, v: (B, L, H, D); valid: (B, L) bool key mask, or None when every
            key is real (nothing to mask);
        attn_bias: optional (B, H, T, L) added to the scaled scores.

    Returns:
        (B, T, H, D).
    """
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T|L, D)
    keep = None if valid is None else valid[:, None, None, :]
    out = _masked_attention(qh, kh, vh, keep, attn_bias, scale, backend)
    return out.transpose(1, 2)  # (B, T, H, D)


def _masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    attn_bias: torch.Tensor | None,
    scale: float,
    backend: str,
) -> torch.Tensor:
    """Softmax attention over the last two dims, any leading (batch-like) dims.

    Args:
        q: (..., T, D); k, v: (..., L, D); keep: bool broadcastable to (..., T, L), True = a
            real key (None: all are); attn_bias: optional, broadcastable to (..., T, L).

    Returns:
        (..., T, D).

    On a CPU with AMX a lone query (T = 1: a decoder's next token, against its own tokens or
    an encoder window) takes torch's fused kernel whatever the backend (`fused_cpu_attention`).
    """
    if backend == "sdpa" or (q.size(-2) == 1 and q.device.type == "cpu"
                             and fused_cpu_attention()):
        mask = _sdpa_mask(keep, attn_bias, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if keep is None and attn_bias is None and math.frexp(scale)[0] == 0.5:
        return _unmasked_attention(q, k, v, scale)
    scores = torch.matmul(q, k.transpose(-2, -1)).float().mul_(scale)  # (..., T, L)
    if attn_bias is not None:
        scores.add_(attn_bias)
    # The most negative finite float, not -inf: exp() of it is exactly 0 next to any real key,
    # so masked keys get probability 0 without a second masking pass, and a row with no key
    # at all (a padded query row) stays finite instead of NaN.
    if keep is not None:
        scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v)  # (..., T, D)


@functools.cache
def fused_cpu_attention() -> bool:
    """Whether this CPU runs torch's fused attention kernel faster than matmuls for the
    decoder's small query blocks (a lone next token; a beam's few), whatever the dtype: where
    it has AMX tiles.

    The kernel multiplies bfloat16 blocks on AMX; without it, it is the slower one. On a
    2-vCPU Sapphire Rapids Xeon (AMX-bf16), bfloat16, one thread, a lone query over 20-1,500
    keys took 2-5x less time in the kernel than in the matmuls and softmax. On a 2-vCPU AMD
    EPYC with AVX512-BF16 and no AMX (2026-12-07, one thread, 6 heads of 64,
    `bench/attention_kernels.py --lone 8 16`): a lone query of 16 rows over 100 / 704 / 1,500
    keys 1.03 / 8.65 / 19.4 ms in the kernel against 0.21 / 1.82 / 3.66 ms in matmuls in
    bfloat16, a beam's 5 queries 1.8-2.1x slower in the kernel; in float32 the two within
    0.95-1.27x of each other. Whisper's greedy batch decodes there took 1.11-1.28x less time
    with the matmuls, beam searches 1.02-1.09x.
    """
    return cpu.has_amx_tiles()


def _unmasked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """``_masked_attention`` with nothing to mask and a power-of-two ``scale``, in three passes:
    the scale folded into the queries (a power of two scales exactly, so the scores round as
    the unscaled product's do), the softmax read from and written in the operands' dtype (it
    computes in float32 inside, as the masked path's explicit casts do). A decoder's lone
    token over 1,500 encoder frames is this case; the masked path's cast, scale and cast-back
    passes over its scores took as long as the two matmuls."""
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., T, L) in q's dtype
    return torch.matmul(torch.softmax(scores, dim=-1), v)  # (..., T, D)


def _sdpa_mask(keep: torch.Tensor | None, attn_bias: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor | None:
    """The additive ``attn_mask`` of ``scaled_dot_product_attention``: ``attn_bias`` (or 0)
    where ``keep``, the dtype's most negative finite value where not.

    Finite rather than -inf for the reason the ``torch`` backend gives: a row with no real key
    (a padded query row of an empty stream) stays finite on every SDPA kernel, not NaN. With no
    bias the mask has ``keep``'s shape, e.g. (B, 1, 1, L): the kernel broadcasts it, nothing of
    the scores' size is built.

    Args:
        keep: bool broadcastable to (..., T, L), True = a real key; None: all are.
        attn_bias: broadcastable to (..., T, L), or None.
    Returns:
        keep's shape (no bias), the bias's (a bias), or None (neither), in ``dtype``.
    """
    if keep is None:
        return None if attn_bias is None else attn_bias.to(dtype)
    if attn_bias is None:
        base = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
        return base.masked_fill_(~keep, torch.finfo(dtype).min)
    return attn_bias.to(dtype).masked_fill(~keep, torch.finfo(dtype).min)
