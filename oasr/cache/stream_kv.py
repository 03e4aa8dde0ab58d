"""One stream's attention K/V bookkeeping: its logical blocks and frame counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StreamKVState:
    """Bookkeeping of one stream in ``AttentionCacheManager`` (owned and edited by it alone);
    ``logical_blocks[i]`` is the physical id of logical block i."""

    slot: int
    logical_blocks: list[int] = field(default_factory=list)
    num_committed_frames: int = 0  # frames of history held
    # frames of the first block before the history (evicted from a partly valid block);
    # start + num_committed_frames == the stream's cache_seqlens row
    start: int = 0
    num_total_frames: int = 0  # frames committed since allocation or the last reset
    num_evictions: int = 0  # blocks evicted over the stream's life (resets do not clear it)
    prepared: bool = False  # prepare_chunk called since allocation or the last reset


@dataclass(frozen=True)
class StreamKVInfo:
    """A snapshot of one stream's K/V bookkeeping (for stats; mutating it changes nothing)."""

    stream_id: int
    slot: int
    block_ids: tuple[int, ...]
    num_cached_frames: int
    num_total_frames: int
    num_evictions: int
