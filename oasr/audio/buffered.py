"""A frame store for incremental feature extractors that hand back the frames they complete.

`StreamingFbank` keeps its own frame store (kaldi-native-fbank's). An extractor that instead
returns finished frames from each call (``accept(samples) -> (F, dim)``, ``flush() -> (F, dim)``,
e.g. the Whisper-CTC family's causal log-mel) is wrapped in `BufferedFeatures`, which gives it
the same absolutely indexed, droppable store, so `ChunkWindower` and the engine read either
one the same way.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from oasr.audio.chunking import check_accept_waveform, check_drop_index, check_frame_range


class IncrementalExtractor(Protocol):
    """One stream's extractor that returns the frames each call completes."""

    def accept(self, samples: np.ndarray) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


class BufferedFeatures:
    """One stream's features from an `IncrementalExtractor`, absolutely indexed from 0.

    Invariant: frames ``[num_frames_dropped, num_frames_ready)`` are retained, in ``_pieces``
    (arrays as the extractor returned them, oldest first); they are joined into one array only
    when read, so appending is O(new frames) however long the backlog.
    """

    def __init__(self, extractor: IncrementalExtractor, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"feature dim must be >= 1, got {dim}")
        self.extractor = extractor
        self.dim = dim
        self.num_frames_dropped = 0
        self.num_frames_ready = 0
        self.num_samples_accepted = 0
        self.is_finished = False
        self._pieces: list[np.ndarray] = []

    @property
    def num_frames_retained(self) -> int:
        """Frames that can still be read: ``num_frames_ready - num_frames_dropped``."""
        return self.num_frames_ready - self.num_frames_dropped

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Append (N,) float32 samples in [-1, 1]; the frames they complete become ready.

        Raises:
            ValueError: ``samples`` is not a 1-D float32 array.
            RuntimeError: called after `input_finished`.
        """
        check_accept_waveform(self, samples)
        if samples.shape[0] == 0:
            return
        self._append(self.extractor.accept(samples))
        self.num_samples_accepted += samples.shape[0]

    def input_finished(self) -> None:
        """End of the stream: the extractor's last frames become ready.

        Raises:
            RuntimeError: called twice.
        """
        if self.is_finished:
            raise RuntimeError("input_finished called twice")
        self._append(self.extractor.flush())
        self.is_finished = True

    def _append(self, frames: np.ndarray) -> None:
        if frames.ndim != 2 or frames.shape[1] != self.dim:
            raise ValueError(
                f"extractor returned frames of shape {tuple(frames.shape)}, expected (F, {self.dim})"
            )
        if frames.shape[0]:
            self._pieces.append(np.asarray(frames, dtype=np.float32))
            self.num_frames_ready += frames.shape[0]

    def _joined(self) -> np.ndarray:
        """The retained frames as one (R, dim) array (joins the pieces once)."""
        if len(self._pieces) != 1:
            joined = (np.concatenate(self._pieces) if self._pieces
                      else np.zeros((0, self.dim), np.float32))
            self._pieces = [joined]
        return self._pieces[0]

    def get_frames(self, start: int, end: int) -> np.ndarray:
        """Copy retained frames ``[start, end)`` (absolute indices).

        Returns:
            (end - start, dim) float32, owned by the caller.
        Raises:
            IndexError: the range is reversed, already dropped or not ready yet.
        """
        check_frame_range(self, start, end)
        base = self.num_frames_dropped
        return self._joined()[start - base : end - base].copy()

    def drop_frames_before(self, index: int) -> None:
        """Forget every frame before absolute ``index``; a no-op for already dropped ones.

        Raises:
            IndexError: ``index`` is beyond `num_frames_ready`.
        """
        if check_drop_index(self, index):
            kept = self._joined()[index - self.num_frames_dropped :]
            self._pieces = [kept] if kept.shape[0] else []
            self.num_frames_dropped = index
