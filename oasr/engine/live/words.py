"""Word times and confidence of live partials and finals.

The CTC pass says when each letter was heard: a hypothesis's token is emitted at one encoder
frame (its timestamp), and the frame's posterior of that token says how sure the acoustic
model was (`Posteriors` keeps each frame's best `TOP_K` log-probs of a stream's open segment,
read back once per step). `ctc_letters` turns a CTC hypothesis into its letters with their
frames and probabilities, word by word.

`timed_words` gives any text of the segment (the CTC text itself, a refined partial, Whisper's
final) its words' times: the text's letters are aligned to the CTC letters (Levenshtein edit
operations on lower-cased letters, spaces aside, so "Bren vic" and "Brenvik" line up); a word
spans the frames of the CTC letters its letters met, from the first one's frame to one frame
after the last one's; a word that met none (a number Whisper wrote in digits, a word the CTC
pass did not hear) shares the gap between its neighbours by length. Words stay in order and
inside the segment. A word's confidence is Whisper's probability of its least likely token
when given (``probs``: a final Whisper wrote), else the CTC pass's: the least probability of
the letters it heard alike, times the share of the word's letters it heard alike.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from oasr.decoding import Hypothesis
from oasr.engine.events import Word

TOP_K = 4  # log-probs kept per frame (the token a hypothesis emits is nearly always among them)
MAX_PEAK_FRAMES = 25  # a hypothesis's last token is looked for this far after its date


class Posteriors:
    """A stream's best `TOP_K` CTC log-probs per encoder frame, absolutely indexed from
    ``start`` (frames decoded again after a cut in the past overwrite the old ones)."""

    def __init__(self) -> None:
        self.start = 0
        self._ids = np.zeros((0, TOP_K), dtype=np.int64)
        self._lps = np.zeros((0, TOP_K), dtype=np.float32)

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

    def drop_before(self, frame: int) -> None:
        """Forget the frames before ``frame`` (a segment ended there)."""
        cut = max(0, min(len(self._ids), frame - self.start))
        self._ids, self._lps = self._ids[cut:], self._lps[cut:]
        self.start = max(self.start, frame)

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

    def peaks(self, tokens: list[int], stamps: list[int]) -> tuple[list[int], list[float | None]]:
        """Each token's frame and posterior at its peak: tokens dated ``stamps`` (absolute,
        increasing) are looked for from their date to the next token's (the last one
        `MAX_PEAK_FRAMES` on), all at once; a token none of its window's frames holds among
        its best keeps its date, with the probability `prob` gives there."""
        n = len(tokens)
        dates = np.asarray(stamps, dtype=np.int64)
        ends = np.append(dates[1:], dates[-1] + MAX_PEAK_FRAMES)
        lo, hi = max(int(dates[0]), self.start), min(int(ends[-1]), self.end)
        best = np.full(n, -np.inf)
        first = np.full(n, np.iinfo(np.int64).max)
        if hi > lo:
            frames = np.arange(lo, hi)
            owner = np.searchsorted(dates, frames, side="right") - 1  # (F,) token of each frame
            rows = frames - self.start
            wanted = np.asarray(tokens, dtype=np.int64)[owner]
            score = np.where(self._ids[rows] == wanted[:, None], self._lps[rows],
                             -np.inf).max(axis=1)
            np.maximum.at(best, owner, score)
            top = np.isfinite(score) & (score == best[owner])
            np.minimum.at(first, owner[top], frames[top])
        found = np.isfinite(best)
        out_frames = np.where(found, first, dates).tolist()
        out_probs: list[float | None] = [
            float(np.exp(b)) if ok else self.prob(d, t)
            for b, ok, d, t in zip(best.tolist(), found.tolist(), stamps, tokens, strict=True)]
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


@dataclass(frozen=True)
class CtcLetters:
    """A CTC hypothesis's letters (spaces aside) with the absolute frame that emitted each
    and its probability there (None: unknown), and where each of its words begins in them."""

    letters: str
    frames: tuple[int, ...]
    probs: tuple[float | None, ...]
    word_starts: tuple[int, ...]

    @property
    def first_frame(self) -> int | None:
        return self.frames[0] if self.frames else None

    @property
    def last_frame(self) -> int | None:
        return self.frames[-1] if self.frames else None


NO_LETTERS = CtcLetters("", (), (), ())


def _fold(text: str) -> str:
    """Lower-case letters and digits of ``text`` (accents dropped; apostrophes kept)."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return re.sub(r"[^\w']|_", "", "".join(c for c in decomposed if not unicodedata.combining(c)))


_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _below_hundred(n: int) -> str:
    return _ONES[n] if n < 20 else _TENS[n // 10] + (_ONES[n % 10] if n % 10 else "")


def spoken_digits(key: str) -> str:
    """A folded word's numbers as their letters, the way they are read ("4" -> "four",
    "21" -> "twentyone", "1775" -> "seventeenseventyfive", a longer run digit by digit): the
    letters of a number Whisper wrote in digits then line up with the CTC pass's spelling."""
    def spell(match: re.Match[str]) -> str:
        digits = match.group()
        n = int(digits)
        if len(digits) > 1 and digits.startswith("0") or len(digits) > 4:
            return "".join(_ONES[int(d)] for d in digits)
        if n < 100:
            return _below_hundred(n)
        if n % 1000 == 0 or 2000 <= n < 2010:
            return _ONES[n // 1000] + "thousand" + (_ONES[n % 1000] if n % 1000 else "")
        if n < 1000:
            rest = n % 100
            return _ONES[n // 100] + "hundred" + (_below_hundred(rest) if rest else "")
        high, low = divmod(n, 100)
        if low == 0:
            return _below_hundred(high) + "hundred"
        return _below_hundred(high) + ("oh" + _ONES[low] if low < 10 else _below_hundred(low))

    return re.sub(r"\d+", spell, key)


@functools.lru_cache(maxsize=1 << 16)
def _word_key(word: str) -> str:
    """A written word's folded letters with its numbers spelled (`spoken_digits`): what its
    letters align as. Cached: every partial aligns each word of its segment again."""
    return spoken_digits(_fold(word))


def ctc_letters(tokenizer: Any, hyp: Hypothesis | None, base_frame: int,
                posteriors: Posteriors | None = None) -> CtcLetters:
    """``hyp``'s letters with their frames and probabilities: each token is dated by its
    posterior's peak between its timestamp (plus ``base_frame``, the segment's first frame)
    and the next token's (`Posteriors.peaks`), else by its timestamp."""
    if hyp is None or tokenizer is None or not hasattr(tokenizer, "raw_text"):
        return NO_LETTERS
    stamps = [base_frame + int(t) for t in hyp.timestamps]
    frames: list[int] = stamps
    probs: list[float | None] = [None] * len(stamps)
    if posteriors is not None and stamps:
        frames, probs = posteriors.peaks(list(hyp.tokens), stamps)
    letters: list[str] = []
    letter_frames: list[int] = []
    letter_probs: list[float | None] = []
    starts: list[int] = []
    in_word = False
    pieces = _pieces(tokenizer)
    for token, frame, prob in zip(hyp.tokens, frames, probs, strict=True):
        for piece in pieces[token] if token in pieces else _folded_piece(tokenizer, token):
            if piece == " ":
                in_word = False
                continue
            if not in_word:
                starts.append(len(letters))
                in_word = True
            letters.append(piece)
            letter_frames.append(frame)
            letter_probs.append(prob)
    return CtcLetters("".join(letters), tuple(letter_frames), tuple(letter_probs),
                      tuple(starts))


_PIECES: dict[int, dict[int, tuple[str, ...]]] = {}


def _folded_piece(tokenizer: Any, token: int) -> tuple[str, ...]:
    """A unit's text as folded letters, " " for a word break."""
    out: list[str] = []
    for char in tokenizer.raw_text([token]):
        out += [" "] if char.isspace() else list(_fold(char))
    return tuple(out)


def _pieces(tokenizer: Any) -> dict[int, tuple[str, ...]]:
    """Each unit's folded letters, per tokenizer (built once)."""
    table = _PIECES.get(id(tokenizer))
    if table is None:
        units = getattr(tokenizer, "units", [])
        table = {i: _folded_piece(tokenizer, i) for i in range(len(units))}
        _PIECES[id(tokenizer)] = table
    return table


def timed_words(text: str, ctc: CtcLetters, span: tuple[int, int], frame_shift_s: float,
                probs: Sequence[float] = ()) -> tuple[Word, ...]:
    """The words of ``text`` (split at whitespace, as written) with times in stream seconds
    and confidence (see the module docstring).

    Args:
        ctc: the CTC pass's letters of the same audio.
        span: the segment's (first, end) absolute frames: words stay inside it.
        probs: Whisper's probability of each word (its least likely token), when ``text`` is
            Whisper's and it gave one per word; else the CTC pass's confidence is used.
    """
    words = text.split()
    if not words:
        return ()
    lo, hi = span
    keys = [_word_key(w) for w in words]
    target = "".join(keys)
    heard: list[list[int]] = [[] for _ in words]  # CTC letters met, per word
    alike: list[list[int]] = [[] for _ in words]  # ... of them, the same letter
    owner = np.repeat(np.arange(len(words)), [len(k) for k in keys])
    if target and ctc.letters:
        matched = set()
        for op in Levenshtein.opcodes(target, ctc.letters):
            if op.tag not in ("equal", "replace"):
                continue
            for i, j in zip(range(op.src_start, op.src_end), range(op.dest_start, op.dest_end),
                            strict=False):
                heard[owner[i]].append(j)
                if op.tag == "equal":
                    alike[owner[i]].append(j)
                    matched.add(j)
    spans: list[tuple[float, float] | None] = []
    for met in heard:
        if met:
            spans.append((min(ctc.frames[j] for j in met), max(ctc.frames[j] for j in met) + 1))
        else:
            spans.append(None)
    filled = _fill_gaps(spans, [max(1, len(k)) for k in keys], lo, hi)
    out = []
    end = float(lo)
    for n, (word, (start, stop)) in enumerate(zip(words, filled, strict=True)):
        start = min(max(start, end, lo), hi)
        stop = min(max(stop, start), hi)
        end = stop
        if len(probs) == len(words):
            confidence = float(probs[n])
        else:
            confidence = _ctc_confidence(ctc, alike[n], len(keys[n]))
        out.append(Word(word, round(start * frame_shift_s, 3), round(stop * frame_shift_s, 3),
                        round(min(max(confidence, 0.0), 1.0), 3)))
    return tuple(out)


def _ctc_confidence(ctc: CtcLetters, alike: list[int], num_letters: int) -> float:
    """The least probability of the word's letters the CTC pass heard alike, times the share
    of its letters heard alike (0 when none; 1 when the probabilities are unknown)."""
    if num_letters == 0:
        return 1.0
    if not alike:
        return 0.0
    known = [p for p in (ctc.probs[j] for j in alike) if p is not None]
    least = min(known) if known else 1.0
    return least * min(1.0, len(alike) / num_letters)


def _fill_gaps(spans: list[tuple[float, float] | None], weights: list[int], lo: int, hi: int
               ) -> list[tuple[float, float]]:
    """Each word's (start, end) frames: its own span, or for a run of words with none, a
    share (by ``weights``) of the gap between the spans around it (the segment's edges)."""
    out: list[tuple[float, float]] = []
    i = 0
    while i < len(spans):
        span = spans[i]
        if span is not None:
            out.append(span)
            i += 1
            continue
        j = i
        while j < len(spans) and spans[j] is None:
            j += 1
        gap_start = out[-1][1] if out else lo
        following = spans[j] if j < len(spans) else None
        gap_end = following[0] if following is not None else hi
        gap_end = max(gap_end, gap_start)
        total = sum(weights[i:j])
        at = float(gap_start)
        for k in range(i, j):
            step = (gap_end - gap_start) * weights[k] / total
            out.append((at, at + step))
            at += step
        i = j
    return out
