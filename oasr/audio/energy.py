"""Short-time energy of a stream's audio, one value per encoder frame (for cutting a long
segment at its quietest point)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ENERGY_FLOOR_DB = -100.0
POWER_FLOOR = 10.0 ** (ENERGY_FLOOR_DB / 10.0)


class FrameEnergy:
    """A stream's per-frame energy in dB (mean square of the frame's samples, 0 dB = full
    scale), absolutely indexed from the stream's first frame.

    Invariant: ``values`` holds frames ``[first_frame, first_frame + len(values))``; frame i
    covers samples ``[i * samples_per_frame, (i + 1) * samples_per_frame)``; samples of an
    unfinished frame wait in ``_rest``.
    """

    def __init__(self, samples_per_frame: int) -> None:
        if samples_per_frame < 1:
            raise ValueError(f"samples_per_frame must be >= 1, got {samples_per_frame}")
        self.samples_per_frame = samples_per_frame
        self.first_frame = 0
        self.values = np.zeros(0, dtype=np.float32)
        self._rest = np.zeros(0, dtype=np.float32)

    @property
    def num_frames(self) -> int:
        """Frames computed since the stream began (held or discarded)."""
        return self.first_frame + len(self.values)

    def append(self, samples: np.ndarray) -> None:
        """Add (N,) float32 samples; every frame they complete gets its energy."""
        FrameEnergy.append_many([self], [samples])

    @staticmethod
    def append_many(energies: Sequence[FrameEnergy], samples: Sequence[np.ndarray]) -> None:
        """``energies[i].append(samples[i])`` for every i, the frames of all of them squared,
        summed and logged in one pass (an engine step's hundreds of streams: numpy's per-call
        cost would otherwise count once per stream for each of those passes)."""
        groups: dict[int, list[tuple[FrameEnergy, np.ndarray]]] = {}  # by frame size
        for energy, new in zip(energies, samples, strict=True):
            new = np.asarray(new, dtype=np.float32).reshape(-1)
            joined = np.concatenate([energy._rest, new]) if len(energy._rest) else new
            size = energy.samples_per_frame
            n = len(joined) // size
            energy._rest = joined[n * size:].copy()  # (a view would pin the caller's array)
            if n:
                groups.setdefault(size, []).append((energy, joined[: n * size]))
        for size, members in groups.items():
            frames = np.concatenate([whole for _, whole in members]).reshape(-1, size)
            frames = frames.astype(np.float64)
            power = np.square(frames, out=frames).sum(axis=1) / size  # (F,) mean square
            db = np.log10(np.maximum(power, POWER_FLOOR, out=power), out=power)
            db *= 10.0
            values = db.astype(np.float32)
            offset = 0
            for energy, whole in members:
                n = len(whole) // size
                energy.values = np.concatenate([energy.values, values[offset:offset + n]])
                offset += n

    def discard_before(self, frame: int) -> None:
        """Forget frames before absolute index ``frame``."""
        drop = min(max(0, frame - self.first_frame), len(self.values))
        if drop:
            self.values = self.values[drop:]
            self.first_frame += drop

    def span(self, start: int, end: int) -> np.ndarray:
        """Energies of frames ``[start, end)`` clipped to what is held: (F,) float32."""
        lo = max(start, self.first_frame) - self.first_frame
        hi = max(lo, min(end, self.num_frames) - self.first_frame)
        return self.values[lo:hi]
