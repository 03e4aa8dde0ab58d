"""Per-step host-to-device uploads through persistent staging buffers (no host sync).

``torch.tensor(values, device="cuda")`` copies from pageable memory: the host waits for the
copy, and with it for everything queued on the stream. A step instead writes its inputs into
buffers allocated once (pinned on CUDA) and issues one asynchronous copy per buffer into
device buffers also allocated once. On CPU the host buffer is the device buffer: no copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.audio import FeatureWindow

NUM_INDEX_VECTORS = 3  # feat_lens, offsets, slots


@dataclass(frozen=True)
class StepInputs:
    """The device tensors one chunk step reads, in batch-row order (pad rows last).

    Attributes:
        feats: (W, T, F) feature windows, zero past ``feat_lens``.
        feat_lens: (W,) int64 valid feature frames per row.
        offsets: (W,) int64 encoder frames each row's stream produced since its last reset.
        slots: (W,) int64 the row's slot in the block tables and the state caches.
    """

    feats: torch.Tensor
    feat_lens: torch.Tensor
    offsets: torch.Tensor
    slots: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.feats, self.feat_lens, self.offsets, self.slots)


class StepStaging:
    """Persistent buffers a step's inputs go through: one feature copy, one index copy.

    The index vectors of a width-W step are packed as ``[feat_lens | offsets | slots]`` in the
    first 3W entries of one int64 buffer and the features in the first W*T*F entries of one
    float32 buffer, so each upload is one contiguous copy whatever W and T are. The device
    feature buffer is in the model's compute ``dtype``: the upload's one copy also casts (no
    per-step cast into a freshly allocated tensor; on CPU in float32 host and device buffer
    are one). On CUDA the host buffers are pinned and the copies asynchronous; an event
    recorded after them guards the host buffers, so the next step refills them only once the
    copies have read them (by then the step's decoder read-back has long waited for them).

    Invariant: the tensors of a returned `StepInputs` are views of the device buffers, valid
    until the next `upload`.
    """

    def __init__(self, max_rows: int, max_frames: int, feat_dim: int, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        if min(max_rows, max_frames, feat_dim) < 1:
            raise ValueError(f"staging sizes must be >= 1, got rows {max_rows}, frames "
                             f"{max_frames}, dim {feat_dim}")
        self.device, self.dtype = device, dtype
        self.max_rows, self.max_frames, self.feat_dim = max_rows, max_frames, feat_dim
        pinned = device.type == "cuda"
        self._host_feats = torch.zeros(max_rows * max_frames * feat_dim, pin_memory=pinned)
        self._host_index = torch.zeros(NUM_INDEX_VECTORS * max_rows, dtype=torch.int64,
                                       pin_memory=pinned)
        self._device_feats = self._host_feats
        if pinned or dtype != self._host_feats.dtype:
            self._device_feats = torch.zeros_like(self._host_feats, device=device, dtype=dtype)
        self._device_index = self._host_index
        if pinned:
            self._device_index = torch.zeros_like(self._host_index, device=device)
        self._copied: torch.cuda.Event | None = None
        self.num_uploads = 0

    def upload(self, windows: Sequence[FeatureWindow], offsets: Sequence[int],
               slots: Sequence[int], frames: int) -> StepInputs:
        """Stage one step: rows ``len(slots)`` (the windows' rows, then pad rows).

        Args:
            windows: the real rows' feature windows (each at most ``frames`` frames).
            offsets: the real rows' offsets.
            slots: every row's slot, pad-lane slots after the real rows'.
            frames: T, the padded window length.
        Returns:
            `StepInputs` of width ``len(slots)``, features in ``dtype``; pad rows get zero features counted as
            ``frames`` valid frames (a full chunk of silence: finite, and written only into
            the pad lane) and offset 0.
        Raises:
            ValueError: more rows or frames than the buffers hold.
        """
        width, real = len(slots), len(windows)
        if not real <= width <= self.max_rows or frames > self.max_frames:
            raise ValueError(f"a step of {width} rows x {frames} frames does not fit the "
                             f"staging buffers ({self.max_rows} x {self.max_frames})")
        if self._copied is not None:
            self._copied.synchronize()  # the last upload's copies have read the host buffers
        size = width * frames * self.feat_dim
        feats = self._host_feats[:size].numpy().reshape(width, frames, self.feat_dim)
        feats.fill(0.0)
        index = self._host_index[: NUM_INDEX_VECTORS * width].numpy().reshape(-1, width)
        index[0].fill(frames)
        index[1].fill(0)
        for row, window in enumerate(windows):
            feats[row, : window.num_frames] = window.feats
            index[0, row] = window.num_frames
        index[1, :real] = np.asarray(offsets, dtype=np.int64)
        index[2] = np.asarray(slots, dtype=np.int64)
        device_feats = self._copy(self._host_feats, self._device_feats, size)
        device_index = self._copy(self._host_index, self._device_index, NUM_INDEX_VECTORS * width)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        self.num_uploads += 1
        lens, offs, rows = device_index.view(NUM_INDEX_VECTORS, width).unbind(0)
        return StepInputs(device_feats.view(width, frames, self.feat_dim), lens, offs, rows)

    def _copy(self, host: torch.Tensor, device: torch.Tensor, n: int) -> torch.Tensor:
        if device is host:
            return host[:n]
        device[:n].copy_(host[:n], non_blocking=True)
        return device[:n]

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a view into this staging's device buffers (tests)."""
        ptr = tensor.data_ptr()
        return any(buf.data_ptr() <= ptr < buf.data_ptr() + buf.numel() * buf.element_size()
                   for buf in (self._device_feats, self._device_index))
