"""The shared K/V block pool: two preallocated tensors and a thread-safe free list of block ids.

Mechanism only: the pool knows block ids, their free order and the lock. How many blocks a
stream holds, and which stream owns which block, is the attention cache manager's business.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import torch

from oasr.cache.types import CacheConfig


class BlockPool:
    """Preallocated K and V storage for every layer, handed out one block id at a time.

    The storage is private: ``get_kv_view(layer)`` and ``get_kv_block_view(layer, block_id)``
    are the only ways to its tensors (the attention managers and the models read and write
    through them), so a subclass may store K/V differently by overriding these two and
    ``zero_blocks``. As built here, K and V are each one tensor of shape
    (num_layers, max_num_blocks + scratch_blocks, block_size_frames, n_kv_head, head_dim).
    Ids ``[0, max_num_blocks)`` are allocatable; ids ``[max_num_blocks, num_physical_blocks)``
    are scratch blocks: never on the free list and refused by ``free``. Padding rows of a batch
    point at a scratch block, so what they write is never read by a stream.

    Invariant: every allocatable id is either on the free list exactly once or handed out
    exactly once. The free list is a FIFO deque (freed ids go to the tail), so allocation order
    is deterministic and recently freed blocks are reused last; a parallel ``_is_free`` flag per
    id makes double-free detection O(1). Both are guarded by one lock, so ``allocate`` and
    ``free`` may be called from several threads.

    The tensors are zero-initialised: a block's unwritten slots hold zeros, never NaN (paged
    attention multiplies masked columns into P @ V with weight zero).
    """

    def __init__(self, config: CacheConfig, scratch_blocks: int = 0) -> None:
        if not isinstance(scratch_blocks, int) or scratch_blocks < 0:
            raise ValueError(f"scratch_blocks must be an int >= 0, got {scratch_blocks!r}")
        self.config = config
        self.num_blocks = config.max_num_blocks
        self.num_scratch_blocks = scratch_blocks
        shape = (
            config.num_layers,
            config.max_num_blocks + scratch_blocks,
            config.block_size_frames,
            config.n_kv_head,
            config.head_dim,
        )
        self._k_pool = torch.zeros(shape, dtype=config.dtype, device=config.device)
        self._v_pool = torch.zeros(shape, dtype=config.dtype, device=config.device)
        self._free: deque[int] = deque(range(config.max_num_blocks))
        self._is_free = [True] * config.max_num_blocks
        self._lock = threading.Lock()

    @property
    def num_physical_blocks(self) -> int:
        """Blocks in the tensors: allocatable plus scratch."""
        return self.num_blocks + self.num_scratch_blocks

    @property
    def scratch_block_ids(self) -> tuple[int, ...]:
        """Ids of the scratch blocks (past ``max_num_blocks``)."""
        return tuple(range(self.num_blocks, self.num_physical_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Allocatable blocks currently on the free list."""
        with self._lock:
            return len(self._free)

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """One block of one layer: (block_size_frames, n_kv_head, head_dim)."""
        cfg = self.config
        return (cfg.block_size_frames, cfg.n_kv_head, cfg.head_dim)

    @property
    def dtype(self) -> torch.dtype:
        """Element type of K and V."""
        return self.config.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of K and V together, every layer and physical block."""
        return self._k_pool.nbytes + self._v_pool.nbytes

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` block ids off the head of the free list.

        Args:
            n: number of blocks, >= 0.
        Returns:
            The ids, in free-list order.
        Raises:
            ValueError: ``n`` negative.
            RuntimeError: fewer than ``n`` blocks free (nothing is taken).
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        with self._lock:
            if n > len(self._free):
                raise RuntimeError(
                    f"BlockPool exhausted: requested {n} blocks, {len(self._free)} free "
                    f"of {self.num_blocks}"
                )
            ids = [self._free.popleft() for _ in range(n)]
            for block_id in ids:
                assert self._is_free[block_id], f"block {block_id} was on the free list twice"
                self._is_free[block_id] = False
        return ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the tail of the free list. All ids are checked before any is freed.

        Raises:
            ValueError: a scratch block, an id outside the pool, an id already free, or the same
                id twice in ``block_ids``.
        """
        ids = list(block_ids)
        with self._lock:
            seen: set[int] = set()
            for block_id in ids:
                self._check_freeable(block_id, seen)
                seen.add(block_id)
            for block_id in ids:
                self._is_free[block_id] = True
                self._free.append(block_id)

    def _check_freeable(self, block_id: int, seen: set[int]) -> None:
        if not isinstance(block_id, int) or isinstance(block_id, bool):
            raise ValueError(f"block id must be an int, got {block_id!r}")
        if self.num_blocks <= block_id < self.num_physical_blocks:
            raise ValueError(
                f"block {block_id} is a scratch block (ids {self.num_blocks}.."
                f"{self.num_physical_blocks - 1}); scratch blocks are never allocated or freed"
            )
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"unknown block id {block_id}: the pool has ids 0..{self.num_blocks - 1}")
        if self._is_free[block_id] or block_id in seen:
            raise ValueError(f"double free of block {block_id}: it is already free")

    def get_kv_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V, each (num_physical_blocks, block_size_frames, n_kv_head, head_dim).

        Views into the pool: writes through them land in the pool.
        """
        self._check_layer(layer)
        return self._k_pool[layer], self._v_pool[layer]

    def get_kv_block_view(self, layer: int, block_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One block of one layer, K and V each (block_size_frames, n_kv_head, head_dim); views."""
        self._check_layer(layer)
        if not 0 <= block_id < self.num_physical_blocks:
            raise ValueError(
                f"block id {block_id} out of range: the pool has {self.num_physical_blocks} "
                "physical blocks"
            )
        return self._k_pool[layer, block_id], self._v_pool[layer, block_id]

    def zero_blocks(self, block_ids: Iterable[int]) -> None:
        """Zero K and V of the given blocks in every layer (a fill per block, no host copy)."""
        for block_id in block_ids:
            self._k_pool[:, block_id].zero_()
            self._v_pool[:, block_id].zero_()

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.config.num_layers:
            raise ValueError(f"layer {layer} out of range: the pool has {self.config.num_layers} layers")
