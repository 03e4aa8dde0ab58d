"""Short-time energy of a stream's audio, one value per encoder frame (for cutting a long
segment at its quietest point)."""

from __future__ import annotations

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
        joined = np.concatenate([self._rest, np.asarray(samples, dtype=np.float32)])
        size = self.samples_per_frame
        n = len(joined) // size
        if n:  # (every stream calls this for every message: numpy's per-call cost counts)
            frames = joined[: n * size].reshape(n, size).astype(np.float64)
            power = np.square(frames, out=frames).sum(axis=1) / size  # (n,) mean square
            db = np.log10(np.maximum(power, POWER_FLOOR, out=power), out=power)
            db *= 10.0
            self.values = np.concatenate([self.values, db.astype(np.float32)])
        self._rest = joined[n * size:]

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
