"""Cutting a stream of fbank frames into the encoder's overlapping per-chunk input windows.

The encoder's convolutional subsampling turns ``n`` fbank frames into
``(n - right_context - 1) // subsampling + 1`` output frames (for n >= right_context + 1) and
keeps no state between calls. So a chunk of ``chunk_size`` output frames needs a window of
``(chunk_size - 1) * subsampling + right_context + 1`` fbank frames, and consecutive chunks
start ``chunk_size * subsampling`` frames apart: the windows overlap by
``right_context + 1 - subsampling`` frames. For the 4x conv2d stem (subsampling 4, right
context 6) and chunk 16 that is a 67-frame window every 64 frames. At the end of the input a
final, shorter window is emitted when it holds at least ``right_context + 1`` frames (one
encoder frame); fewer frames than that produce no output and are discarded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ChunkGeometry:
    """How encoder chunks map onto fbank frames.

    Attributes:
        chunk_size: encoder output frames per chunk.
        subsampling: frame-rate reduction of the conv stem (4 for WeNet's conv2d).
        right_context: extra fbank frames the stem looks ahead (6 for conv2d, 10 for conv2d6,
            14 for conv2d8).
    """

    chunk_size: int = 16
    subsampling: int = 4
    right_context: int = 6

    def __post_init__(self) -> None:
        for name in ("chunk_size", "subsampling"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.right_context < 0:
            raise ValueError(f"right_context must be >= 0, got {self.right_context}")
        if self.right_context + 1 < self.subsampling:
            raise ValueError(
                f"right_context {self.right_context} + 1 < subsampling {self.subsampling}: "
                f"windows would skip fbank frames"
            )

    @property
    def window_frames(self) -> int:
        """Fbank frames in one full chunk's window (67 for chunk 16, subsampling 4, context 6)."""
        return (self.chunk_size - 1) * self.subsampling + self.right_context + 1

    @property
    def stride_frames(self) -> int:
        """Fbank frames between the starts of consecutive windows (64 for chunk 16, 4x)."""
        return self.chunk_size * self.subsampling

    @property
    def min_window_frames(self) -> int:
        """Fewest fbank frames that yield one encoder frame (7 for 4x conv2d)."""
        return self.right_context + 1

    def num_output_frames(self, num_input_frames: int) -> int:
        """Encoder frames the stem makes of ``num_input_frames`` fbank frames."""
        if num_input_frames < self.min_window_frames:
            return 0
        return (num_input_frames - self.min_window_frames) // self.subsampling + 1

    def window_starts(self, num_frames: int) -> list[int]:
        """Start frame of every window of a finished input of ``num_frames`` frames."""
        return list(range(0, num_frames - self.min_window_frames + 1, self.stride_frames))


@dataclass(frozen=True)
class FeatureWindow:
    """One chunk's encoder input.

    Attributes:
        feats: (num_frames, F) float32 fbank frames, owned by the receiver.
        index: chunk number within the stream, from 0.
        start_frame: absolute fbank index of ``feats[0]``.
        num_output_frames: encoder frames this window yields (chunk_size unless it is short).
        is_last: no further window will follow (the input has finished). A window taken
            before the input finished says False even if none follows; the engine then learns
            the end from `ChunkWindower.is_exhausted`.
    """

    feats: np.ndarray
    index: int
    start_frame: int
    num_output_frames: int
    is_last: bool

    @property
    def num_frames(self) -> int:
        """Fbank frames in the window."""
        return int(self.feats.shape[0])


class FrameSource(Protocol):
    """What `ChunkWindower` reads from; `oasr.audio.fbank.StreamingFbank` is one."""

    @property
    def num_frames_ready(self) -> int: ...

    @property
    def is_finished(self) -> bool: ...

    def get_frames(self, start: int, end: int) -> np.ndarray: ...

    def drop_frames_before(self, index: int) -> None: ...


class FeatureSource(FrameSource, Protocol):
    """One stream's feature extractor as the engine drives it: samples in, frames out.

    `oasr.audio.fbank.StreamingFbank` (the Conformer's Kaldi fbank) and
    `oasr.audio.buffered.BufferedFeatures` (e.g. the Whisper-CTC causal log-mel) are two.
    """

    @property
    def num_frames_retained(self) -> int: ...

    @property
    def num_samples_accepted(self) -> int: ...

    @property
    def num_frames_dropped(self) -> int: ...

    def accept_waveform(self, samples: np.ndarray) -> None: ...

    def input_finished(self) -> None: ...


def check_accept_waveform(source: FeatureSource, samples: np.ndarray) -> None:
    """What every `FeatureSource.accept_waveform` refuses, with the same messages.

    Raises:
        ValueError: ``samples`` is not a 1-D float32 array.
        RuntimeError: the source's input is already finished.
    """
    if source.is_finished:
        raise RuntimeError(
            f"cannot accept audio after input_finished ({source.num_samples_accepted} samples "
            f"accepted, {source.num_frames_ready} frames)"
        )
    if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
        raise ValueError(
            f"expected a 1-D float32 array of samples, got "
            f"{getattr(samples, 'dtype', type(samples).__name__)} of shape "
            f"{getattr(samples, 'shape', '?')}"
        )


def check_frame_range(source: FeatureSource, start: int, end: int) -> None:
    """Raise IndexError unless frames ``[start, end)`` are retained by ``source``."""
    if not source.num_frames_dropped <= start <= end <= source.num_frames_ready:
        raise IndexError(
            f"frames [{start}, {end}) not available: retained are "
            f"[{source.num_frames_dropped}, {source.num_frames_ready})"
        )


def check_drop_index(source: FeatureSource, index: int) -> bool:
    """Whether dropping the frames before ``index`` drops anything.

    Raises:
        IndexError: ``index`` is beyond ``source.num_frames_ready``.
    """
    if index > source.num_frames_ready:
        raise IndexError(
            f"cannot drop frames before {index}: only {source.num_frames_ready} are ready"
        )
    return index > source.num_frames_dropped


class ChunkWindower:
    """Takes one stream's windows from its frame source, in order, each exactly once.

    Invariant: window ``k`` covers frames ``[k * stride, k * stride + window)`` clipped to the
    input (counted from the last `rewind`); after it is taken the source keeps only frames from
    ``(k + 1) * stride - retain_frames`` on (the next window's overlap, and what a rewind may
    need), so a stream holds at most one window, ``retain_frames`` and the frames not yet
    windowed, whatever its length.
    """

    def __init__(self, geometry: ChunkGeometry | None = None, retain_frames: int = 0) -> None:
        if retain_frames < 0:
            raise ValueError(f"retain_frames must be >= 0, got {retain_frames}")
        self.geometry = geometry or ChunkGeometry()
        self.retain_frames = retain_frames  # frames kept before the next window, for `rewind`
        self.num_windows = 0
        self.next_start_frame = 0

    def rewind(self, start_frame: int) -> None:
        """Take the next window from ``start_frame`` again (a segment that ended in the past:
        its later frames are decoded anew).

        Raises:
            ValueError: ``start_frame`` is ahead of the next window or no longer retained.
        """
        if start_frame > self.next_start_frame:
            raise ValueError(f"cannot rewind forward: frame {start_frame} > next window start "
                             f"{self.next_start_frame}")
        if start_frame < self.next_start_frame - self.retain_frames or start_frame < 0:
            raise ValueError(f"frame {start_frame} is no longer retained (next window starts at "
                             f"{self.next_start_frame}, {self.retain_frames} frames kept before it)")
        self.next_start_frame = start_frame

    def is_window_ready(self, source: FrameSource) -> bool:
        """True when `pop_window` would return a window now."""
        return self._next_window_end(source) is not None

    def frames_missing(self, source: FrameSource) -> int | None:
        """Frames the next full window still needs (0: one is ready); None once the input has
        finished (no more frames will come)."""
        if source.is_finished:
            return None
        return max(0, self._full_window_end(self.next_start_frame) - source.num_frames_ready)

    def has_backlog(self, source: FrameSource) -> bool:
        """True when the window after the next is complete too (audio came faster than it
        was decoded)."""
        after_next = self.next_start_frame + self.geometry.stride_frames
        return source.num_frames_ready >= self._full_window_end(after_next)

    def is_exhausted(self, source: FrameSource) -> bool:
        """True when the input has finished and every window has been taken."""
        return source.is_finished and self._next_window_end(source) is None

    def pop_window(self, source: FrameSource) -> FeatureWindow | None:
        """Take the next window if the source has enough frames for it.

        Returns:
            the next `FeatureWindow`, or None if it is not complete yet (or the input is
            exhausted).
        """
        end = self._next_window_end(source)
        if end is None:
            return None
        start = self.next_start_frame
        feats = source.get_frames(start, end)  # (T, F)
        self.next_start_frame = start + self.geometry.stride_frames
        is_last = source.is_finished and self._next_window_end(source) is None
        window = FeatureWindow(
            feats=feats,
            index=self.num_windows,
            start_frame=start,
            num_output_frames=self.geometry.num_output_frames(end - start),
            is_last=is_last,
        )
        self.num_windows += 1
        keep_from = max(0, self.next_start_frame - self.retain_frames)
        source.drop_frames_before(min(keep_from, source.num_frames_ready))
        return window

    def _full_window_end(self, start: int) -> int:
        """The end of a whole window that begins at frame ``start``."""
        return start + self.geometry.window_frames

    def _next_window_end(self, source: FrameSource) -> int | None:
        start, ready = self.next_start_frame, source.num_frames_ready
        end = self._full_window_end(start)
        if ready >= end:
            return end
        if source.is_finished and ready >= start + self.geometry.min_window_frames:
            return ready
        return None


def split_windows(feats: np.ndarray, geometry: ChunkGeometry | None = None) -> list[np.ndarray]:
    """Offline counterpart of `ChunkWindower`: every window of a finished utterance.

    Args:
        feats: (T, F) fbank frames.

    Returns:
        views ``feats[s : s + window]`` for each start s of ``geometry.window_starts(T)``.
    """
    geometry = geometry or ChunkGeometry()
    return [
        feats[start : start + geometry.window_frames]
        for start in geometry.window_starts(feats.shape[0])
    ]
