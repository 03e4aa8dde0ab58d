"""Host-side int32 mirror of a persistent device table, copied to the device in one copy.

Writing a Python scalar through an index into a device tensor (``table[row, i] = block_id``)
is a 4-byte pageable host-to-device copy that waits for all work queued on the stream. The
cache managers instead edit a host mirror (numpy, cheap scalar writes), mark the rows they
touched, and ``flush`` copies the dirty row range to the device tensor in one copy, staged
through pinned memory on CUDA so the copy is asynchronous. The same code runs on CPU, where
the copy is a plain tensor copy.
"""

from __future__ import annotations

import numpy as np
import torch


class HostMirroredTable:
    """A device int32 tensor whose truth lives in a host numpy array until ``flush``.

    Invariant: after ``flush``, ``device`` equals ``host``. Between flushes only ``host``
    changes, and ``[_dirty_lo, _dirty_hi)`` covers every row that changed. The device tensor is
    allocated once and never reallocated, so views and captured addresses stay valid.
    """

    def __init__(self, shape: tuple[int, ...], device: torch.device) -> None:
        self.host = np.zeros(shape, dtype=np.int32)
        self.device = torch.zeros(shape, dtype=torch.int32, device=device)
        self._dirty_lo = shape[0]
        self._dirty_hi = 0

    def mark_dirty(self, row: int) -> None:
        """Record that ``host[row]`` changed."""
        self._dirty_lo = min(self._dirty_lo, row)
        self._dirty_hi = max(self._dirty_hi, row + 1)

    @property
    def is_dirty(self) -> bool:
        return self._dirty_lo < self._dirty_hi

    def flush(self) -> None:
        """Copy the dirty row range to the device tensor (one copy; nothing when clean)."""
        if not self.is_dirty:
            return
        lo, hi = self._dirty_lo, self._dirty_hi
        staged = torch.from_numpy(self.host[lo:hi])
        if self.device.is_cuda:
            # The caching host allocator keeps this pinned buffer alive until the copy is done,
            # so the host array may be edited right after this call.
            staged = staged.pin_memory()
        self.device[lo:hi].copy_(staged, non_blocking=self.device.is_cuda)
        self._dirty_lo, self._dirty_hi = self.host.shape[0], 0
