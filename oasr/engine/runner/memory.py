"""K/V pool sizing: bytes per block, and a block count derived from available memory.

The pool size is computed before the ``CacheConfig`` that carries it is built: a `PoolDemand`
says what the pool must hold, `derive_num_blocks` turns it and a memory budget into a block
count, and the config is built once with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from oasr.cache.types import CacheConfig
from oasr.models import ConformerConfig

if TYPE_CHECKING:
    from oasr.engine.config import EngineConfig
    from oasr.engine.families.base import KVGeometry


def kv_block_bytes(num_layers: int, block_size_frames: int, n_kv_head: int, head_dim: int,
                   dtype: torch.dtype) -> int:
    """Bytes one pool block takes across all layers, K and V:
    2 * num_layers * block_size_frames * n_kv_head * head_dim * element size.

    192 KiB for the default geometry (12 layers, 4 heads, head_dim 64, 16 frames) in fp16.
    """
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size_frames * n_kv_head * head_dim * element


def bytes_per_kv_block(config: CacheConfig) -> int:
    """`kv_block_bytes` of ``config``'s geometry."""
    return kv_block_bytes(config.num_layers, config.block_size_frames, config.n_kv_head,
                          config.head_dim, config.dtype)


def kv_pool_bytes(config: CacheConfig, scratch_blocks: int = 0) -> int:
    """Bytes of a ``BlockPool(config, scratch_blocks)``'s K and V tensors together."""
    return bytes_per_kv_block(config) * (config.max_num_blocks + scratch_blocks)


def available_memory_bytes(device: torch.device | str) -> int:
    """Memory a pool could take now: free VRAM on CUDA, available RAM on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class PoolDemand:
    """What a K/V pool must hold, known before its size is.

    Attributes:
        block_bytes: bytes of one block (`kv_block_bytes`).
        num_slots: streams that run at once (``max_batch_size``).
        max_blocks_per_seq: width of a block-table row: the most blocks one stream can address.
        peak_blocks_per_stream: with eviction, the most blocks one stream holds at once (its
            retained window plus the block of the chunk in flight); None for unlimited history.
        device: where the pool will live (whose memory is the budget).
    """

    block_bytes: int
    num_slots: int
    max_blocks_per_seq: int
    peak_blocks_per_stream: int | None
    device: torch.device

    @property
    def min_blocks(self) -> int:
        """Blocks every slot needs to run at once: with eviction, each stream's retained
        window plus its in-flight block; with unlimited history, one block per stream."""
        per_stream = self.peak_blocks_per_stream if self.peak_blocks_per_stream is not None else 1
        return self.num_slots * per_stream

    @property
    def max_blocks(self) -> int:
        """Blocks the block tables can address (num_slots * max_blocks_per_seq)."""
        return self.num_slots * self.max_blocks_per_seq


def derive_num_blocks(
    demand: PoolDemand, memory_fraction: float, available_bytes: int | None = None
) -> int:
    """The pool size ``max_num_blocks`` for ``demand``.

    With eviction on, every stream's history is bounded, so the pool is exactly
    ``demand.min_blocks`` once it is checked to fit. With unlimited history it is what
    ``memory_fraction`` of the available memory holds, capped at ``demand.max_blocks``.

    Args:
        memory_fraction: share of ``available_bytes`` the pool may take, in (0, 1].
        available_bytes: defaults to ``available_memory_bytes(demand.device)``.
    Raises:
        ValueError: ``memory_fraction`` outside (0, 1].
        RuntimeError: the budget holds fewer blocks than ``demand.min_blocks``.
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    if available_bytes is None:
        available_bytes = available_memory_bytes(demand.device)
    budget = int(available_bytes * memory_fraction)
    affordable = budget // demand.block_bytes
    needed = demand.min_blocks
    if affordable < needed:
        raise RuntimeError(
            f"K/V pool budget {budget} bytes ({memory_fraction:.0%} of {available_bytes}) holds "
            f"{affordable} blocks of {demand.block_bytes} bytes, but {demand.num_slots} streams "
            f"need {needed}; lower max_batch_size, num_left_chunks or block_size_frames, or "
            "raise the memory fraction"
        )
    if demand.peak_blocks_per_stream is not None:
        return needed
    return min(affordable, demand.max_blocks)


def cache_config_for(config: EngineConfig, geometry: KVGeometry | ConformerConfig,
                     device: torch.device, dtype: torch.dtype, chunk_size: int | None = None,
                     max_stream_frames: int | None = None) -> CacheConfig:
    """The cache geometry for a model under ``config``, pool size included.

    Args:
        geometry: the model family's `KVGeometry` (a ConformerConfig is converted).
        chunk_size: the resolved chunk size; None takes ``config.chunk_size``, else 16.
        max_stream_frames: the most encoder frames a stream can ever hold (a model's
            position limit) or None: narrows the block tables, and so the pool ceiling,
            to what such a stream can use.
    ``max_num_blocks=None`` is derived here by `derive_num_blocks` before the config is
    built (size first, then build once).
    """
    from oasr.cache.types import peak_blocks
    from oasr.engine.families.base import KVGeometry

    if isinstance(geometry, ConformerConfig):
        geometry = KVGeometry(
            num_layers=geometry.num_blocks, n_kv_head=geometry.attention_heads,
            head_dim=geometry.output_size // geometry.attention_heads,
            hidden_dim=geometry.output_size, kernel_size=geometry.cnn_module_kernel)
    chunk = chunk_size if chunk_size is not None else config.resolve_chunk_size(16)
    block = config.block_size_frames if config.block_size_frames is not None else chunk
    peak = peak_blocks(chunk, config.num_left_chunks, block)
    blocks_per_seq = config.max_blocks_per_seq
    if max_stream_frames is not None:  # + 1: the in-flight block before eviction
        blocks_per_seq = min(blocks_per_seq, -(-max_stream_frames // block) + 1)
    num_blocks = config.max_num_blocks
    if num_blocks is None:
        demand = PoolDemand(
            block_bytes=kv_block_bytes(geometry.num_layers, block, geometry.n_kv_head,
                                       geometry.head_dim, dtype),
            num_slots=config.max_batch_size, max_blocks_per_seq=blocks_per_seq,
            peak_blocks_per_stream=peak, device=device)
        num_blocks = derive_num_blocks(demand, config.kv_memory_fraction)
    return CacheConfig(
        num_layers=geometry.num_layers,
        n_kv_head=geometry.n_kv_head,
        head_dim=geometry.head_dim,
        hidden_dim=geometry.hidden_dim,
        kernel_size=geometry.kernel_size,
        chunk_size=chunk,
        num_left_chunks=config.num_left_chunks,
        prefill_kv_window=config.prefill_kv_window,
        block_size_frames=block,
        max_num_blocks=num_blocks,
        max_blocks_per_seq=blocks_per_seq,
        max_batch_size=config.max_batch_size,
        device=device,
        dtype=dtype,
    )
