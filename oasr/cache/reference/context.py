"""``StreamContext``: one stream's view of the attention, conv and CTC caches.

The specification's per-request facade: tests and the specification's examples drive
a stream through it. The engine does not: it opens, steps and closes cohorts of streams
through ``oasr.engine.runner.streams.StreamResources``, which owns the slots.
"""

from __future__ import annotations

import torch

from oasr.cache.attention_cache import AttentionCacheManager
from oasr.cache.cnn_cache import CnnCacheManager
from oasr.cache.ctc_state import CtcStateCacheManager, StreamHandle
from oasr.fmha import PagedKVCache


class StreamContext:
    """A stream id bound to the three managers, so a chunk loop reads as one object's calls.

    Holds no state of its own beyond the id: every call forwards to the managers, which own the
    storage and bookkeeping. The stream must be allocated in each manager (``open`` does that,
    binding the conv cache to the attention manager's slot).

    One conv-cache layout throughout: (num_layers, 1, kernel_size - 1, hidden_dim), what
    ``get_cnn_cache`` returns and both commits take, and what ``AsrModel.forward_chunk`` and
    ``AsrModel.forward_chunk_paged`` take and return. WeNet's (L, 1, hidden_dim, k - 1) appears
    only in the ``*_wenet_*`` pair, for ``ConformerEncoder.forward_chunk``.
    """

    def __init__(
        self,
        stream_id: int,
        attention: AttentionCacheManager,
        cnn: CnnCacheManager,
        ctc: CtcStateCacheManager | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.attention = attention
        self.cnn = cnn
        self.ctc = ctc

    @classmethod
    def open(
        cls, stream_id: int, attention: AttentionCacheManager, cnn: CnnCacheManager,
        ctc: CtcStateCacheManager | None = None, *,
        vocab_size: int | None = None, batch: int = 1, slot: int | None = None,
    ) -> StreamContext:
        """Allocate the stream in every manager under one slot and bundle them.

        Args:
            slot: the stream's slot from the caller's ``StreamSlotPool``; None binds the lowest
                slot the attention manager has not bound, and the others follow it.
        Raises:
            ValueError: duplicate stream id, a bound slot, or ``ctc`` without ``vocab_size``.
            RuntimeError: no free slot or no room for a prefilled window.
        """
        if ctc is not None and vocab_size is None:
            raise ValueError("StreamContext.open needs vocab_size to allocate a CTC state")
        slot = attention.allocate_stream(stream_id, slot)
        try:
            cnn.allocate_stream(stream_id, slot)
            if ctc is not None:
                assert vocab_size is not None
                ctc.allocate_stream(stream_id, batch, vocab_size, slot if batch == 1 else None)
        except BaseException:
            if stream_id in cnn:
                cnn.free_stream(stream_id)
            attention.free_stream(stream_id)
            raise
        return cls(stream_id, attention, cnn, ctc)

    @property
    def slot(self) -> int:
        return self.attention.slot_of(self.stream_id)

    # ---------------------------------------------------------------- paged mode
    def prepare_chunk(self) -> None:
        """Blocks for the next chunk (paged mode)."""
        self.attention.prepare_chunk(self.stream_id)

    def get_att_caches(self) -> list[PagedKVCache]:
        """One ``PagedKVCache`` per layer (B = 1)."""
        return self.attention.get_paged_caches(self.stream_id)

    def get_paged_state_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """block_table (1, max_blocks_per_seq) and cache_seqlens (1,) views."""
        return self.attention.get_paged_state_views(self.stream_id)

    def commit_chunk_paged(self, chunk_frames: int, new_cnn_cache: torch.Tensor | None = None) -> None:
        """Account the chunk's frames (evicting as configured) and store its conv cache.

        Args:
            chunk_frames: encoder frames the chunk produced.
            new_cnn_cache: (num_layers, 1, kernel_size - 1, hidden_dim), or None to leave it.
        """
        self.attention.commit_chunk_paged(self.stream_id, chunk_frames)
        if new_cnn_cache is not None:
            self.cnn.update(self.stream_id, new_cnn_cache)

    # ---------------------------------------------------------------- dense mode
    def get_att_cache(self) -> torch.Tensor:
        """(num_layers, n_kv_head, T_cached, 2 * head_dim) packed K|V history."""
        return self.attention.get_stacked_cache(self.stream_id)

    def commit_chunk(self, new_kv_chunk: torch.Tensor, new_cnn_cache: torch.Tensor | None = None) -> None:
        """Store the chunk's K|V (num_layers, n_kv_head, T, 2 * head_dim) and its conv cache
        (num_layers, 1, kernel_size - 1, hidden_dim)."""
        self.attention.commit(self.stream_id, new_kv_chunk)
        if new_cnn_cache is not None:
            self.cnn.update(self.stream_id, new_cnn_cache)

    def get_wenet_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Both caches in WeNet ``forward_chunk`` layout: att_cache (L, H, T_cached, 2 * d_k) and
        cnn_cache (L, 1, hidden_dim, kernel_size - 1)."""
        return self.get_att_cache(), self.cnn.get_wenet_cache(self.stream_id)

    def commit_wenet_chunk(
        self, new_att_cache: torch.Tensor, new_cnn_cache: torch.Tensor, chunk_frames: int
    ) -> None:
        """Store what WeNet's ``forward_chunk`` returned for a chunk of ``chunk_frames`` frames.

        Args:
            new_att_cache: (L, H, T, 2 * d_k) with T >= chunk_frames; its last ``chunk_frames``
                frames are the chunk's K|V.
            new_cnn_cache: (L, 1, hidden_dim, kernel_size - 1).
        """
        if new_att_cache.size(2) < chunk_frames:
            raise ValueError(
                f"new_att_cache holds {new_att_cache.size(2)} frames, fewer than the chunk's "
                f"{chunk_frames}: call forward_chunk with required_cache_size=-1"
            )
        self.attention.commit(self.stream_id, new_att_cache[:, :, new_att_cache.size(2) - chunk_frames :])
        self.cnn.update_wenet(self.stream_id, new_cnn_cache)

    # ---------------------------------------------------------------- both modes
    def get_cnn_cache(self) -> torch.Tensor:
        """(num_layers, 1, kernel_size - 1, hidden_dim) view of the stream's conv cache."""
        return self.cnn.get_cache(self.stream_id)

    def get_decoder(self) -> StreamHandle:
        if self.ctc is None:
            raise RuntimeError(f"stream {self.stream_id}'s context was built without a CTC manager")
        return self.ctc.get_decoder(self.stream_id)

    def at_capacity(self) -> bool:
        return self.attention.at_capacity(self.stream_id)

    @property
    def num_cached_frames(self) -> int:
        """Frames of attention history held (host int)."""
        return self.attention.num_cached_frames(self.stream_id)

    def cached_frames(self) -> torch.Tensor:
        """(1,) int32 device tensor of held frames, the ``cache_t1`` of a forward."""
        return self.attention.cached_frames([self.stream_id])

    def reset(self) -> None:
        """An endpoint: history, conv context and decoder state start over; the slot is kept."""
        self.attention.reset_stream(self.stream_id)
        self.cnn.reset_stream(self.stream_id)
        if self.ctc is not None:
            self.ctc.reset_stream(self.stream_id)

    def free(self) -> None:
        """Release the blocks, the slot, the conv slot and the decoder row."""
        if self.ctc is not None:
            self.ctc.free_stream(self.stream_id)
        self.cnn.free_stream(self.stream_id)
        self.attention.free_stream(self.stream_id)
