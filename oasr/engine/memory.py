"""K/V pool sizing: bytes per block, and a block count derived from available memory."""

from __future__ import annotations

import os

import torch

from oasr.cache.types import CacheConfig


def bytes_per_kv_block(config: CacheConfig) -> int:
    """Bytes one pool block takes across all layers, K and V:
    2 * num_layers * block_size_frames * n_kv_head * head_dim * element size.

    192 KiB for the default geometry (12 layers, 4 heads, head_dim 64, 16 frames) in fp16.
    """
    element = torch.empty((), dtype=config.dtype).element_size()
    return (
        2 * config.num_layers * config.block_size_frames * config.n_kv_head * config.head_dim * element
    )


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


def min_pool_blocks(config: CacheConfig) -> int:
    """Blocks every slot needs to run at once: with eviction, each stream's retained window
    plus its in-flight block; with unlimited history, one block per stream."""
    per_stream = config.peak_blocks_per_stream if config.has_eviction else 1
    return config.max_batch_size * per_stream


def derive_num_blocks(
    config: CacheConfig, memory_fraction: float, available_bytes: int | None = None
) -> int:
    """The pool size ``max_num_blocks`` for ``config``'s geometry (its own value is ignored).

    With eviction on, every stream's history is bounded, so the pool is exactly
    ``min_pool_blocks`` once it is checked to fit. With unlimited history it is what
    ``memory_fraction`` of the available memory holds, capped at what the block tables can
    address (max_batch_size * max_blocks_per_seq).

    Args:
        memory_fraction: share of ``available_bytes`` the pool may take, in (0, 1].
        available_bytes: defaults to ``available_memory_bytes(config.device)``.
    Raises:
        ValueError: ``memory_fraction`` outside (0, 1].
        RuntimeError: the budget holds fewer blocks than ``min_pool_blocks``.
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    if available_bytes is None:
        available_bytes = available_memory_bytes(config.device)
    block_bytes = bytes_per_kv_block(config)
    budget = int(available_bytes * memory_fraction)
    affordable = budget // block_bytes
    needed = min_pool_blocks(config)
    if affordable < needed:
        raise RuntimeError(
            f"K/V pool budget {budget} bytes ({memory_fraction:.0%} of {available_bytes}) holds "
            f"{affordable} blocks of {block_bytes} bytes, but {config.max_batch_size} streams need "
            f"{needed}; lower max_batch_size, num_left_chunks or block_size_frames, or raise the "
            "memory fraction"
        )
    if config.max_logical_blocks is not None:
        return needed
    return min(affordable, config.max_batch_size * config.max_blocks_per_seq)
