"""A frame store for incremental feature extractors that hand back the frames they complete.

`StreamingFbank` keeps its own frame store (kaldi-native-fbank's). An extractor that instead
returns finished frames from each call (``accept(samples) -> (F, dim)``, ``flush() -> (F, dim)``,
e.g. the Whisper-CTC family's causal log-mel) is wrapped in `BufferedFeatures`, which gives it
the same absolutely indexed, droppable store, so `ChunkWindower` and the engine read either
one the same way. An extractor class with an ``accept_many`` class method (`BatchExtractor`)
computes many streams' frames in one call: `accept_waveforms` feeds every stream of an engine
step that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np

from oasr.audio.chunking import (
    FeatureSource,
    check_accept_waveform,
    check_drop_index,
    check_frame_range,
)


class IncrementalExtractor(Protocol):
    """One stream's extractor that returns the frames each call completes."""

    def accept(self, samples: np.ndarray) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


class BatchExtractor(IncrementalExtractor, Protocol):
    """An extractor class that also computes many streams' new frames in one call."""

    @classmethod
    def accept_many(cls, extractors: Sequence[BatchExtractor],
                    samples: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``extractors[i].accept(samples[i])`` for every i, together."""
        ...


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
        self._accepted(self.extractor.accept(samples), samples.shape[0])

    def _accepted(self, frames: np.ndarray, num_samples: int) -> None:
        """The extractor turned ``num_samples`` new samples into ``frames``."""
        self._append(frames)
        self.num_samples_accepted += num_samples

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


def accept_waveforms(sources: Sequence[FeatureSource],
                     samples: Sequence[np.ndarray]) -> list[Exception | None]:
    """``sources[i].accept_waveform(samples[i])`` for every i; the `BufferedFeatures` whose
    extractors are of one `BatchExtractor` class are computed in one ``accept_many`` call (the
    Whisper-CTC log-mel: one FFT and one mel product for every stream of a step).

    Returns:
        For each item, the exception its ``accept_waveform`` raised, or None. Refusals
        (`check_accept_waveform`) are each item's own; an ``accept_many`` that fails is the
        failure of every item it held.
    """
    errors: list[Exception | None] = [None] * len(sources)
    batches: dict[type[BatchExtractor], list[tuple[int, BufferedFeatures]]] = {}
    for i, (source, chunk) in enumerate(zip(sources, samples, strict=True)):
        kind = type(source.extractor) if isinstance(source, BufferedFeatures) else None
        try:
            if kind is None or not hasattr(kind, "accept_many"):
                source.accept_waveform(chunk)
            else:
                check_accept_waveform(source, chunk)
                batches.setdefault(cast("type[BatchExtractor]", kind), []).append(
                    (i, cast(BufferedFeatures, source)))
        except Exception as exc:  # one stream's bad audio is that stream's
            errors[i] = exc
    for kind, members in batches.items():
        try:
            frames = kind.accept_many([cast(BatchExtractor, b.extractor) for _, b in members],
                                      [samples[i] for i, _ in members])
            for (i, source), new in zip(members, frames, strict=True):
                source._accepted(new, len(samples[i]))
        except Exception as exc:
            for i, _ in members:
                errors[i] = exc
    return errors
