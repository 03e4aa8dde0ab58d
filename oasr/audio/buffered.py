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

    Invariant: frames ``[num_frames_dropped, num_frames_ready)`` are retained, in rows
    ``[_first, _first + num_frames_retained)`` of ``_frames``, a buffer with room after them.
    New frames are written into that room, and dropped ones only move ``_first``; when the room
    runs out the retained rows move to the front (when they and the new ones fill between a
    quarter and half of the buffer) or into a buffer twice the size of both. Appending is
    O(new frames) amortized and a read copies only the frames it asks for, however long the
    backlog (a stream keeps a few seconds of frames for a cut in the past: joining them anew
    each chunk copied them all).
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
        self._frames = np.zeros((0, dim), dtype=np.float32)
        self._first = 0

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
        count = frames.shape[0]
        if count:
            self._make_room(count)
            end = self._first + self.num_frames_retained
            self._frames[end : end + count] = frames
            self.num_frames_ready += count

    def _make_room(self, count: int) -> None:
        """Room for ``count`` more rows after the retained ones."""
        held = self.num_frames_retained
        if self._first + held + count <= len(self._frames):
            return
        kept = self._frames[self._first : self._first + held]
        size = 2 * (held + count)
        if size <= len(self._frames) <= 2 * size:
            self._frames[:held] = kept  # (numpy copies an overlapping source first)
        else:  # grown, or shrunk after a backlog was read
            resized = np.empty((size, self.dim), dtype=np.float32)
            resized[:held] = kept
            self._frames = resized
        self._first = 0

    def get_frames(self, start: int, end: int) -> np.ndarray:
        """Copy retained frames ``[start, end)`` (absolute indices).

        Returns:
            (end - start, dim) float32, owned by the caller.
        Raises:
            IndexError: the range is reversed, already dropped or not ready yet.
        """
        check_frame_range(self, start, end)
        base = self._first - self.num_frames_dropped
        return self._frames[start + base : end + base].copy()

    def drop_frames_before(self, index: int) -> None:
        """Forget every frame before absolute ``index``; a no-op for already dropped ones.

        Raises:
            IndexError: ``index`` is beyond `num_frames_ready`.
        """
        if check_drop_index(self, index):
            self._first += index - self.num_frames_dropped
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
