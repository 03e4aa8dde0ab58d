"""The cache subsystem's one shared configuration: pool geometry, stream window, device."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def retained_blocks(chunk_size: int, num_left_chunks: int, block_size_frames: int) -> int | None:
    """Blocks a stream retains after a commit: ``num_left_chunks`` chunks of history rounded up
    to whole blocks; None when history is unlimited (``num_left_chunks == -1``)."""
    if num_left_chunks < 0:
        return None
    return math.ceil(chunk_size * num_left_chunks / block_size_frames)


_POSITIVE_FIELDS = (
    "num_layers",
    "n_kv_head",
    "head_dim",
    "hidden_dim",
    "kernel_size",
    "chunk_size",
    "block_size_frames",
    "max_num_blocks",
    "max_blocks_per_seq",
    "max_batch_size",
)


@dataclass(frozen=True)
class CacheConfig:
    """Geometry of every per-stream cache: the shared K/V block pool, the conv left context and
    the per-stream block tables.

    Frame ``p`` of a stream's retained history lives in logical block ``p // block_size_frames``
    at slot ``p % block_size_frames``. A chunk of at most ``chunk_size`` frames therefore needs at
    most one new block, which is why ``chunk_size > block_size_frames`` is refused.

    Attributes:
        num_layers: encoder layers (one K/V plane and one conv cache per layer).
        n_kv_head: key/value heads per layer.
        head_dim: per-head dimension d_k of K and of V.
        hidden_dim: encoder width, the channel count of the conv left-context cache.
        kernel_size: depthwise conv kernel; the conv cache holds ``kernel_size - 1`` frames.
        chunk_size: encoder output frames per chunk.
        num_left_chunks: retained history in chunks; -1 keeps everything (no eviction).
        block_size_frames: frames per physical block.
        max_num_blocks: blocks in the pool (scratch blocks come on top, see ``BlockPool``).
        max_blocks_per_seq: width of a stream's block-table row.
        max_batch_size: stream slots, i.e. block-table rows handed to streams.
        prefill_kv_window: hand each stream its whole retained window, zeroed, at admission, so
            every stream reports the same cached length (needs ``num_left_chunks >= 0``).
        device: where the pool and the tables live (default: CUDA when available, else CPU).
        dtype: K/V pool and conv cache element type.
    """

    num_layers: int = 12
    n_kv_head: int = 4
    head_dim: int = 64
    hidden_dim: int = 256
    kernel_size: int = 15
    chunk_size: int = 16
    num_left_chunks: int = -1
    block_size_frames: int = 16
    max_num_blocks: int = 1024
    max_blocks_per_seq: int = 512
    max_batch_size: int = 32
    prefill_kv_window: bool = False
    device: torch.device = field(default_factory=default_device)
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))
        self._validate_fields()
        self._validate_geometry()
        if self.max_logical_blocks is None:
            logger.info(
                "unlimited history (num_left_chunks=-1): each stream holds at most %d blocks = "
                "%d encoder frames, then finishes with reason 'length'; raise max_num_blocks "
                "(%d for %d slots) or set num_left_chunks to evict old context instead",
                self.blocks_per_stream,
                self.max_stream_frames,
                self.max_num_blocks,
                self.max_batch_size,
            )

    def _validate_fields(self) -> None:
        for name in _POSITIVE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CacheConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.num_left_chunks, int) or self.num_left_chunks < -1:
            raise ValueError(
                f"CacheConfig.num_left_chunks must be -1 (unlimited) or >= 0, "
                f"got {self.num_left_chunks!r}"
            )
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise ValueError(f"CacheConfig.dtype must be a floating torch.dtype, got {self.dtype!r}")
        if self.prefill_kv_window and self.num_left_chunks < 0:
            raise ValueError(
                "CacheConfig.prefill_kv_window needs a bounded window: set num_left_chunks >= 0 "
                "(got -1, unlimited history) or prefill_kv_window=False"
            )

    def _validate_geometry(self) -> None:
        if self.chunk_size > self.block_size_frames:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) > block_size_frames ({self.block_size_frames}): "
                "a chunk must fit in the one block allocated for it, or its K/V would spill into "
                "the page read as the next chunk's; set block_size_frames >= chunk_size "
                f"(e.g. block_size_frames={self.chunk_size})"
            )
        mlb = self.max_logical_blocks
        if mlb is None and self.max_num_blocks < self.max_batch_size:
            raise ValueError(
                f"max_num_blocks ({self.max_num_blocks}) < max_batch_size ({self.max_batch_size}):"
                " with unlimited history (num_left_chunks=-1) each stream's share is "
                "max_num_blocks // max_batch_size = 0 blocks; raise max_num_blocks to at least "
                f"{self.max_batch_size}, lower max_batch_size or set num_left_chunks >= 0"
            )
        if mlb is not None:
            self._validate_bounded_pool(mlb)
        if mlb is not None and self.max_blocks_per_seq < mlb + 1:
            raise ValueError(
                f"max_blocks_per_seq ({self.max_blocks_per_seq}) cannot address the history "
                f"num_left_chunks={self.num_left_chunks} asks for: {mlb} retained blocks plus "
                f"the in-flight chunk's block; set max_blocks_per_seq >= {mlb + 1} or lower "
                "num_left_chunks"
            )

    def _validate_bounded_pool(self, mlb: int) -> None:
        """With eviction every stream's footprint is bounded, so the pool must hold all of them
        at once (seed §10.2): ``max_batch_size`` streams of ``peak_blocks_per_stream`` blocks."""
        need = self.max_batch_size * self.peak_blocks_per_stream
        if self.max_num_blocks < need:
            fits = self.max_num_blocks // self.peak_blocks_per_stream
            lower = f", lower max_batch_size to {fits}" if fits else ""
            raise ValueError(
                f"max_num_blocks ({self.max_num_blocks}) cannot hold max_batch_size "
                f"({self.max_batch_size}) streams: with num_left_chunks={self.num_left_chunks} "
                f"each stream holds up to {mlb} blocks plus one for the chunk in flight, "
                f"{self.peak_blocks_per_stream} x {self.max_batch_size} = {need}; raise "
                f"max_num_blocks to {need}{lower} or lower num_left_chunks"
            )
        if self.prefill_kv_window and self.chunk_size != self.block_size_frames:
            lo = mlb * self.block_size_frames - self.block_size_frames + self.chunk_size
            raise ValueError(
                f"prefill_kv_window needs chunk_size == block_size_frames (got {self.chunk_size} "
                f"and {self.block_size_frames}): eviction frees whole blocks, so a smaller chunk "
                f"leaves the held window alternating between {lo} and "
                f"{mlb * self.block_size_frames} frames, and the window would not be uniform; "
                f"set block_size_frames={self.chunk_size}"
            )

    @property
    def peak_blocks_per_stream(self) -> int:
        """The most blocks one stream holds at once: ``blocks_per_stream`` plus, with eviction,
        the block of the chunk in flight (allocated before the forward, evicted at commit)."""
        return self.blocks_per_stream + (1 if self.has_eviction else 0)

    @property
    def kv_last_dim(self) -> int:
        """Last dim of the dense packed cache: K in ``[..., :head_dim]``, V in the rest."""
        return self.head_dim * 2

    @property
    def cnn_cache_frames(self) -> int:
        """Left-context frames a causal depthwise conv keeps per layer."""
        return self.kernel_size - 1

    @property
    def has_eviction(self) -> bool:
        """True when history is bounded (``num_left_chunks >= 0``) and old blocks are evicted."""
        return self.num_left_chunks >= 0

    @property
    def max_logical_blocks(self) -> int | None:
        """Blocks a stream retains after a commit; None when history is unlimited."""
        return retained_blocks(self.chunk_size, self.num_left_chunks, self.block_size_frames)

    @property
    def blocks_per_stream(self) -> int:
        """Logical blocks one stream may hold before it is at capacity."""
        mlb = self.max_logical_blocks
        if mlb is not None:
            return mlb
        return min(self.max_blocks_per_seq, self.max_num_blocks // self.max_batch_size)

    @property
    def max_stream_frames(self) -> int:
        """Encoder-frame ceiling of one stream's history (``blocks_per_stream`` blocks)."""
        return self.blocks_per_stream * self.block_size_frames

    @property
    def prefill_frames(self) -> int:
        """Frames of the zeroed window a stream starts with (0 unless ``prefill_kv_window``)."""
        if not self.prefill_kv_window:
            return 0
        return self.blocks_per_stream * self.block_size_frames
