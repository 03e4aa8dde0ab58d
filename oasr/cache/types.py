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


def max_start_frame(chunk_size: int, block_size_frames: int) -> int:
    """The furthest into its first block a stream's history can begin: eviction is by frame
    and a stream moves a whole chunk at a time, so the history's first frame sits on a grid of
    ``gcd(chunk_size, block_size_frames)`` frames within the block (0 when chunks are whole
    blocks)."""
    return block_size_frames - math.gcd(chunk_size, block_size_frames)


def retained_blocks(chunk_size: int, num_left_chunks: int, block_size_frames: int) -> int | None:
    """Blocks a stream holds after a commit: its last ``chunk_size * num_left_chunks`` frames,
    which may begin up to `max_start_frame` frames into their first block; None when history
    is unlimited (``num_left_chunks == -1``)."""
    if num_left_chunks < 0:
        return None
    window = chunk_size * num_left_chunks
    if window == 0:
        return 0
    return math.ceil((max_start_frame(chunk_size, block_size_frames) + window) / block_size_frames)


def peak_blocks(chunk_size: int, num_left_chunks: int, block_size_frames: int) -> int | None:
    """Blocks a stream holds at most with eviction: its retained window plus the chunk in
    flight (allocated before the forward, evicted at the commit); None when history is
    unlimited."""
    if num_left_chunks < 0:
        return None
    frames = max_start_frame(chunk_size, block_size_frames) + chunk_size * (num_left_chunks + 1)
    return math.ceil(frames / block_size_frames)


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

    Frame ``p`` of a stream's block-table row lives in logical block ``p // block_size_frames``
    at slot ``p % block_size_frames``. With eviction a stream keeps exactly its last
    ``chunk_size * num_left_chunks`` frames after every full chunk: old frames are evicted one by
    one (whole blocks are freed once every frame of them is), so the history may begin inside
    the row's first block (`max_start_frame`). Any chunk and block sizes work together: a chunk
    takes as many new blocks as its frames reach.

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
        peak = self.peak_blocks_per_stream
        if mlb is not None and self.max_blocks_per_seq < peak:
            raise ValueError(
                f"max_blocks_per_seq ({self.max_blocks_per_seq}) cannot address the history "
                f"num_left_chunks={self.num_left_chunks} asks for: up to {mlb} retained blocks "
                f"and the in-flight chunk, {peak} blocks; set max_blocks_per_seq >= {peak} or "
                "lower num_left_chunks"
            )

    def _validate_bounded_pool(self, mlb: int) -> None:
        """With eviction every stream's footprint is bounded, so the pool must hold all of them
        at once (a prefilled window): ``max_batch_size`` streams of ``peak_blocks_per_stream`` blocks."""
        need = self.max_batch_size * self.peak_blocks_per_stream
        if self.max_num_blocks < need:
            fits = self.max_num_blocks // self.peak_blocks_per_stream
            lower = f", lower max_batch_size to {fits}" if fits else ""
            raise ValueError(
                f"max_num_blocks ({self.max_num_blocks}) cannot hold max_batch_size "
                f"({self.max_batch_size}) streams: with num_left_chunks={self.num_left_chunks} "
                f"each stream holds up to {self.peak_blocks_per_stream} blocks with the chunk in "
                f"flight, {self.peak_blocks_per_stream} x {self.max_batch_size} = {need}; raise "
                f"max_num_blocks to {need}{lower} or lower num_left_chunks"
            )

    @property
    def peak_blocks_per_stream(self) -> int:
        """The most blocks one stream holds at once: with eviction its window and the chunk in
        flight (allocated before the forward, evicted at commit: `peak_blocks`), else
        ``blocks_per_stream``."""
        peak = peak_blocks(self.chunk_size, self.num_left_chunks, self.block_size_frames)
        return self.blocks_per_stream if peak is None else peak

    @property
    def history_frames(self) -> int | None:
        """Frames a stream keeps after every full chunk, ``chunk_size * num_left_chunks``;
        None when history is unlimited."""
        return self.chunk_size * self.num_left_chunks if self.has_eviction else None

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
        """Blocks a stream retains after a commit, at most (`retained_blocks`); None when
        history is unlimited."""
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
        """Frames of the zeroed window a stream starts with (0 unless ``prefill_kv_window``):
        its whole history, ``history_frames``."""
        if not self.prefill_kv_window:
            return 0
        return self.history_frames or 0
