"""Paged attention over the shared K/V block pool."""

from oasr.fmha.paged import (
    ATTN_BACKEND_ENV,
    ATTN_BACKENDS,
    GatherWorkspace,
    PagedKVCache,
    default_backend,
    dense_attention,
    gather_head_major,
    gather_kv,
    gather_length,
    key_padding_mask,
    paged_attention,
    resolve_backend,
    write_chunk_kv,
)

__all__ = [
    "ATTN_BACKENDS",
    "ATTN_BACKEND_ENV",
    "GatherWorkspace",
    "PagedKVCache",
    "default_backend",
    "dense_attention",
    "gather_head_major",
    "gather_kv",
    "gather_length",
    "key_padding_mask",
    "paged_attention",
    "resolve_backend",
    "write_chunk_kv",
]
