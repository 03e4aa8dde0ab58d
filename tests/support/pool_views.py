"""The whole K or V storage of a `BlockPool`, read through its view methods (the only way to
its tensors), for tests that check what landed where."""

from __future__ import annotations

import torch

from oasr.cache import BlockPool


def pool_k(pool: BlockPool) -> torch.Tensor:
    """(num_layers, num_physical_blocks, block_size, H, D): every layer's K, stacked (a copy)."""
    return torch.stack([pool.get_kv_view(layer)[0] for layer in range(pool.config.num_layers)])


def pool_v(pool: BlockPool) -> torch.Tensor:
    """(num_layers, num_physical_blocks, block_size, H, D): every layer's V, stacked (a copy)."""
    return torch.stack([pool.get_kv_view(layer)[1] for layer in range(pool.config.num_layers)])


def fill_blocks(pool: BlockPool, value: float, block_ids: list[int] | None = None) -> None:
    """Write ``value`` into K and V of ``block_ids`` (None: every physical block), every layer."""
    for layer in range(pool.config.num_layers):
        for tensor in pool.get_kv_view(layer):  # (num_physical_blocks, block_size, H, D)
            if block_ids is None:
                tensor.fill_(value)
            else:
                tensor[block_ids] = value
