"""What the CTC pass heard, frame by frame: a stream's best `TOP_K` log-probs per encoder frame
(`Posteriors`, read back once per step) and the frame and probability at which each token of a
hypothesis peaked (`Posteriors.peaks`), which the word times and confidences are built from
(`oasr.engine.live.words`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oasr.decoding.compiled_search import jit

TOP_K = 4  # log-probs kept per frame (the token a hypothesis emits is nearly always among them)
MAX_PEAK_FRAMES = 25  # a hypothesis's last token is looked for this far after its date


@dataclass(frozen=True)
class _PeakMemo:
    """A `Posteriors.peaks` call's tokens and dates and its answer, per token."""

    tokens: list[int]
    stamps: list[int]
    frames: list[int]
    probs: list[float | None]


class Posteriors:
    """A stream's best `TOP_K` CTC log-probs per encoder frame, absolutely indexed from
    ``start`` (frames decoded again after a cut in the past overwrite the old ones).

    It keeps its last reusing `peaks` call's answer (``_memo``) and the frame before which no
    frame was written again since (``_memo_valid_to``): a partial's hypothesis mostly grows at
    its end, so the next call looks again only for the tokens whose window changed."""

    def __init__(self) -> None:
        self.start = 0
        self._ids = np.zeros((0, TOP_K), dtype=np.int64)
        self._lps = np.zeros((0, TOP_K), dtype=np.float32)
        self._memo: _PeakMemo | None = None
        self._memo_valid_to = 0

    @property
    def end(self) -> int:
        return self.start + len(self._ids)

    def write(self, first_frame: int, ids: np.ndarray, log_probs: np.ndarray) -> None:
        """A chunk's frames from ``first_frame`` on: ``ids``, ``log_probs`` (T, k)."""
        if first_frame < self.start:  # before what is kept: only its tail matters
            skip = self.start - first_frame
            ids, log_probs, first_frame = ids[skip:], log_probs[skip:], self.start
        keep = min(len(self._ids), first_frame - self.start)
        gap = first_frame - self.start - keep
        pad_ids = np.zeros((gap, ids.shape[1]), dtype=np.int64)
        pad_lps = np.full((gap, ids.shape[1]), -np.inf, dtype=np.float32)
        self._ids = np.concatenate([self._ids[:keep], pad_ids, ids.astype(np.int64)])
        self._lps = np.concatenate([self._lps[:keep], pad_lps, log_probs.astype(np.float32)])
        self._memo_valid_to = min(self._memo_valid_to, first_frame)

    def drop_before(self, frame: int) -> None:
        """Forget the frames before ``frame`` (a segment ended there)."""
        cut = max(0, min(len(self._ids), frame - self.start))
        self._ids, self._lps = self._ids[cut:], self._lps[cut:]
        self.start = max(self.start, frame)
        self._memo = None

    def peak(self, token: int, start: int, end: int) -> tuple[int, float] | None:
        """The frame in [start, end) where ``token``'s posterior is highest among the frames
        that have it in their best `TOP_K`, and that posterior; None when none has."""
        lo, hi = max(start - self.start, 0), min(end - self.start, len(self._ids))
        if hi <= lo:
            return None
        scores = np.where(self._ids[lo:hi] == token, self._lps[lo:hi], -np.inf).max(axis=1)
        best = int(scores.argmax())
        if not np.isfinite(scores[best]):
            return None
        return self.start + lo + best, float(np.exp(scores[best]))

    def peaks(self, tokens: list[int], stamps: list[int], reuse: bool = False
              ) -> tuple[list[int], list[float | None]]:
        """Each token's frame and posterior at its peak: tokens dated ``stamps`` (absolute,
        increasing) are looked for from their date to the next token's (the last one
        `MAX_PEAK_FRAMES` on), all at once; a token none of its window's frames holds among
        its best keeps its date, with the probability `prob` gives there.

        Args:
            reuse: take the last reusing call's answer for the leading tokens whose dates,
                window and frames are unchanged since (the same answer, computed once), and
                keep this call's for the next.
        """
        k = self._num_unchanged_peaks(tokens, stamps) if reuse else 0
        frames, probs = self._find_peaks(tokens[k:], stamps[k:])
        if k:
            assert self._memo is not None
            frames, probs = self._memo.frames[:k] + frames, self._memo.probs[:k] + probs
        if reuse:
            self._memo = _PeakMemo(tokens, stamps, frames, probs)
            self._memo_valid_to = self.end
        return frames, probs

    def _num_unchanged_peaks(self, tokens: list[int], stamps: list[int]) -> int:
        """How many leading tokens keep the memo's peaks: same token, same date, same window
        end (the next token's date, or both last), and no frame before the window's end
        written again since."""
        memo = self._memo
        if memo is None:
            return 0
        n = len(tokens)
        common = min(common_prefix(tokens, memo.tokens), common_prefix(stamps, memo.stamps))
        k = common if common == n == len(memo.tokens) else max(common - 1, 0)
        while k:
            window_end = stamps[k] if k < n else stamps[k - 1] + MAX_PEAK_FRAMES
            if max(window_end, stamps[k - 1] + 1) <= self._memo_valid_to:
                break
            k -= 1
        return k

    def _find_peaks(self, tokens: list[int], stamps: list[int]
                    ) -> tuple[list[int], list[float | None]]:
        n = len(tokens)
        if n == 0:
            return [], []
        lo, hi = max(stamps[0], self.start), min(stamps[-1] + MAX_PEAK_FRAMES, self.end)
        dates = np.array(stamps, dtype=np.int64)
        best = np.full(n, -np.inf)  # per token: its best posterior's log (NaN: one was NaN) ...
        first = dates.copy()  # ... and the first frame that has it
        if hi > lo:
            _window_peaks(self._ids, self._lps, self.start, lo, hi,
                          np.array(tokens, dtype=np.int64), dates, best, first)
        out_frames: list[int] = []
        out_probs: list[float | None] = []
        for score, frame, date, token in zip(best.tolist(), first.tolist(), stamps, tokens,
                                              strict=True):
            if math.isfinite(score):
                out_frames.append(frame)
                out_probs.append(float(np.exp(score)))
            else:
                out_frames.append(date)
                out_probs.append(self.prob(date, token))
        return out_frames, out_probs

    def prob(self, frame: int, token: int) -> float | None:
        """P(``token``) at ``frame``: its posterior when among the frame's best, else at
        most the least of them; None for a frame not kept."""
        row = frame - self.start
        if not 0 <= row < len(self._ids):
            return None
        hits = np.nonzero(self._ids[row] == token)[0]
        lp = self._lps[row, hits[0]] if len(hits) else self._lps[row].min()
        return float(np.exp(lp))


def ensure_compiled() -> None:
    """Compile `Posteriors.peaks`'s machine code now (or load it from numba's cache: numba's
    first use in a process takes about 0.5 s, a cold compile about 0.3 s more), not in the
    first live partial, where it would hold up every stream's step. Engines call it when
    they build their live policy; later calls return at once."""
    if _compiled.is_set():
        return
    posteriors = Posteriors()  # the argument types every live call passes
    posteriors.write(0, np.zeros((2, TOP_K), dtype=np.int64), np.zeros((2, TOP_K), np.float32))
    posteriors.peaks([0], [0])
    _compiled.set()


_compiled = threading.Event()


@jit()
def _window_peaks(ids, lps, start, lo, hi, tokens, stamps, best, first):  # noqa: ANN001
    """For frames ``lo:hi`` (absolute; ``ids`` / ``lps`` rows from ``start``): each frame
    belongs to the last token dated at or before it; the token's log-prob there (its entry
    among the frame's best, -inf when absent, NaN when NaN) raises ``best`` of that token,
    ``first`` keeping the first frame of the highest (a NaN, once seen, stays)."""
    i = 0
    n = tokens.shape[0]
    for frame in range(lo, hi):
        while i + 1 < n and stamps[i + 1] <= frame:
            i += 1
        row = frame - start
        score = -np.inf
        for j in range(ids.shape[1]):
            if ids[row, j] == tokens[i]:
                value = np.float64(lps[row, j])
                if value != value or value > score:  # NaN wins, as in numpy's max
                    score = value
                if score != score:
                    break
        if score > best[i]:
            best[i] = score
            first[i] = frame
        elif score != score:
            best[i] = score


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (of the same type), found
    by comparing slices (in C): a partial's hypothesis mostly only grows at its end."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
