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

A stream's partials come every chunk, each with the whole open segment: `PartialWords` gives
the same words from what the last partial computed, timing only what the chunk changed.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from oasr.decoding import Hypothesis
from oasr.engine.events import Word
from oasr.engine.live.posteriors import Posteriors, common_prefix


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
    spelled = _Spelling(_pieces(tokenizer), tokenizer)
    spelled.extend(list(hyp.tokens), frames, probs)
    return spelled.letters(NO_LETTERS, 0)


class _Spelling:
    """Tokens' letters (spaces aside) with each one's frame and probability, appended token
    by token from a given letter and word state; per token, the letters after it and whether
    it ends inside a word."""

    def __init__(self, pieces: dict[int, tuple[str, ...]], tokenizer: Any,
                 num_letters: int = 0, in_word: bool = False) -> None:
        self.pieces, self.tokenizer = pieces, tokenizer
        self.num_letters, self.in_word = num_letters, in_word
        self.chars: list[str] = []
        self.frames: list[int] = []
        self.probs: list[float | None] = []
        self.starts: list[int] = []
        self.token_ends: list[int] = []  # letters after each token
        self.token_in_word: list[bool] = []  # ... ends inside a word

    def extend(self, tokens: Sequence[int], frames: Sequence[int],
               probs: Sequence[float | None]) -> None:
        pieces, n, in_word = self.pieces, self.num_letters, self.in_word
        for token, frame, prob in zip(tokens, frames, probs, strict=True):
            for piece in pieces[token] if token in pieces else _folded_piece(self.tokenizer,
                                                                               token):
                if piece == " ":
                    in_word = False
                    continue
                if not in_word:
                    self.starts.append(n)
                    in_word = True
                self.chars.append(piece)
                self.frames.append(frame)
                self.probs.append(prob)
                n += 1
            self.token_ends.append(n)
            self.token_in_word.append(in_word)
        self.num_letters, self.in_word = n, in_word

    def letters(self, before: CtcLetters, num_kept: int) -> CtcLetters:
        """The letters: ``before``'s first ``num_kept`` ones, then the ones spelled here."""
        starts = before.word_starts[:bisect.bisect_left(before.word_starts, num_kept)]
        return CtcLetters(before.letters[:num_kept] + "".join(self.chars),
                          before.frames[:num_kept] + tuple(self.frames),
                          before.probs[:num_kept] + tuple(self.probs),
                          starts + tuple(self.starts))


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
    keys = [_word_key(w) for w in words]
    if "".join(keys) == ctc.letters:  # the CTC text itself: each word meets its own letters
        spans, confidences = _own_letters(ctc, keys, 0)
    else:
        spans, confidences = _aligned_letters(ctc, keys)
    if len(probs) == len(words):
        confidences = [float(p) for p in probs]
    return tuple(_place(words, keys, spans, confidences, span, frame_shift_s).words)


Span = tuple[float, float]


def _own_letters(ctc: CtcLetters, keys: list[str], first_letter: int
                 ) -> tuple[list[Span | None], list[float]]:
    """Each word's span and CTC confidence when its letters are ``ctc``'s, the first one's
    from ``first_letter`` on, all alike."""
    spans: list[Span | None] = []
    confidences = []
    at = first_letter
    for key in keys:
        end = at + len(key)
        frames = ctc.frames[at:end]
        spans.append((min(frames), max(frames) + 1) if frames else None)
        confidences.append(_ctc_confidence(ctc.probs[at:end], len(key)))
        at = end
    return spans, confidences


def _aligned_letters(ctc: CtcLetters, keys: list[str]
                     ) -> tuple[list[Span | None], list[float]]:
    """Each word's span and CTC confidence from the CTC letters its letters met (Levenshtein
    edit operations of the words' letters against ``ctc``'s)."""
    target = "".join(keys)
    heard: list[list[int]] = [[] for _ in keys]  # CTC letters met, per word
    alike: list[list[int]] = [[] for _ in keys]  # ... of them, the same letter
    owner = np.repeat(np.arange(len(keys)), [len(k) for k in keys])
    if target and ctc.letters:
        for op in Levenshtein.opcodes(target, ctc.letters):
            if op.tag not in ("equal", "replace"):
                continue
            for i, j in zip(range(op.src_start, op.src_end), range(op.dest_start, op.dest_end),
                            strict=False):
                heard[owner[i]].append(j)
                if op.tag == "equal":
                    alike[owner[i]].append(j)
    spans: list[Span | None] = []
    for met in heard:
        if met:
            spans.append((min(ctc.frames[j] for j in met), max(ctc.frames[j] for j in met) + 1))
        else:
            spans.append(None)
    confidences = [_ctc_confidence([ctc.probs[j] for j in same], len(key))
                   for same, key in zip(alike, keys, strict=True)]
    return spans, confidences


@dataclass(frozen=True)
class _Placed:
    """Words placed in their segment: each one's `Word`, its span after the gaps were shared
    (`_fill_gaps`) and its end in frames after it was kept in order and inside the segment."""

    words: list[Word]
    filled: list[Span]
    stops: list[float]


def _place(words: list[str], keys: list[str], spans: list[Span | None],
           confidences: list[float], span: tuple[int, int], frame_shift_s: float,
           after: tuple[float, float] | None = None) -> _Placed:
    """The words' times: heard spans kept, the others sharing the gaps, in order and inside
    the segment ``span``. ``after``: the filled span end and the end of the word before
    ``words`` (None: they begin the segment)."""
    lo, hi = span
    gap_start, end = after if after is not None else (lo, float(lo))
    filled = _fill_gaps(spans, [max(1, len(k)) for k in keys], gap_start, hi)
    out, stops = [], []
    for word, (start, stop), confidence in zip(words, filled, confidences, strict=True):
        start = min(max(start, end, lo), hi)
        stop = min(max(stop, start), hi)
        end = stop
        out.append(Word(word, round(start * frame_shift_s, 3), round(stop * frame_shift_s, 3),
                        round(min(max(confidence, 0.0), 1.0), 3)))
        stops.append(stop)
    return _Placed(out, filled, stops)


class PartialWords:
    """The words of one stream's partials: `timed_words` of the partial's text over
    `ctc_letters` of its hypothesis, each partial computing only what its chunk changed.

    Invariant: it holds the last partial's hypothesis (tokens with their peaks, from
    ``Posteriors.peaks(reuse=True)``, and their letters) and, when that partial's text spelled
    its CTC letters, its words as published. A partial keeps the letters of its leading tokens
    whose peaks are unchanged, and the words of the longest prefix whose text and letters
    (frames and probabilities too) are unchanged, that ends in a word with letters (a run of
    unheard words shares a gap up to the next one's) before the last segment end it saw (no
    word of it was held inside the segment); only the words after are timed. A hypothesis
    mostly grows at its end, so a partial's cost follows its chunk, not its segment; where the
    beam search revised earlier words, the prefix kept ends before them. A text that does not
    spell the CTC letters (a refined partial) is aligned from scratch.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._tokens: list[int] = []
        self._token_frames: list[int] = []
        self._token_probs: list[float | None] = []
        self._token_ends: list[int] = []  # letters after each token
        self._token_in_word: list[bool] = []  # ... ends inside a word
        self._letters = NO_LETTERS
        self._words: list[str] = []  # the last partial's words, when its text spelled its letters
        self._word_ends: list[int] = []  # letters after each word
        self._placed = _Placed([], [], [])
        self._span = (0, 0)
        self._frame_shift_s = 0.0

    def words(self, text: str, hyp: Hypothesis | None, posteriors: Posteriors,
              span: tuple[int, int], frame_shift_s: float) -> tuple[Word, ...]:
        """``timed_words(text, ctc_letters(tokenizer, hyp, span[0], posteriors), span,
        frame_shift_s)``, from what the last call computed.

        Args:
            text: the partial's text.
            hyp: the CTC pass's hypothesis of the open segment (None: none yet).
            posteriors: the stream's.
            span: the segment's (first, end) absolute frames.
        """
        if hyp is None or not hasattr(self.tokenizer, "raw_text"):
            self._words = []
            return timed_words(text, ctc_letters(self.tokenizer, hyp, span[0]), span,
                               frame_shift_s)
        num_kept = self._spell(hyp, span[0], posteriors)
        return self._time(text, num_kept, span, frame_shift_s)

    def _spell(self, hyp: Hypothesis, base_frame: int, posteriors: Posteriors) -> int:
        """Update the letters to ``hyp``'s; the number of leading letters unchanged."""
        tokens = list(hyp.tokens)
        stamps = [base_frame + int(t) for t in hyp.timestamps]
        frames, probs = posteriors.peaks(tokens, stamps, reuse=True) if stamps else ([], [])
        k = min(common_prefix(tokens, self._tokens), common_prefix(frames, self._token_frames),
                common_prefix(probs, self._token_probs))
        num_kept = self._token_ends[k - 1] if k else 0
        spelled = _Spelling(_pieces(self.tokenizer), self.tokenizer, num_kept,
                            k > 0 and self._token_in_word[k - 1])
        spelled.extend(tokens[k:], frames[k:], probs[k:])
        self._letters = spelled.letters(self._letters, num_kept)
        self._tokens, self._token_frames, self._token_probs = tokens, frames, probs
        self._token_ends = self._token_ends[:k] + spelled.token_ends
        self._token_in_word = self._token_in_word[:k] + spelled.token_in_word
        return num_kept

    def _time(self, text: str, num_kept: int, span: tuple[int, int], frame_shift_s: float
              ) -> tuple[Word, ...]:
        """The text's words, those of the prefix `_num_words_kept` allows as they were."""
        words = text.split()
        m = self._num_words_kept(words, num_kept, span, frame_shift_s)
        keys = [_word_key(w) for w in words[m:]]
        first = self._word_ends[m - 1] if m else 0
        letters = self._letters
        if letters.letters[first:] != "".join(keys):  # (the kept words spell theirs)
            self._words = []
            return timed_words(text, letters, span, frame_shift_s)
        spans, confidences = _own_letters(letters, keys, first)
        kept = self._placed
        after = (kept.filled[m - 1][1], kept.stops[m - 1]) if m else None
        new = _place(words[m:], keys, spans, confidences, span, frame_shift_s, after)
        self._placed = _Placed(kept.words[:m] + new.words, kept.filled[:m] + new.filled,
                               kept.stops[:m] + new.stops)
        self._words = words
        self._word_ends = self._word_ends[:m] + list(itertools.accumulate(
            (len(k) for k in keys), initial=first))[1:]
        self._span, self._frame_shift_s = span, frame_shift_s
        return tuple(self._placed.words)

    def _num_words_kept(self, words: list[str], num_kept: int, span: tuple[int, int],
                        frame_shift_s: float) -> int:
        """How many leading words are the last partial's, placed the same: same segment start
        and frame shift, its end not earlier; same words over unchanged letters (the first
        ``num_kept``); the last of them heard (it has letters) and ending before the last
        segment end (so none was held inside it, and the new end holds none either)."""
        if (span[0] != self._span[0] or span[1] < self._span[1]
                or frame_shift_s != self._frame_shift_s):
            return 0
        ends = self._word_ends
        m = bisect.bisect_right(ends, num_kept, hi=len(self._words))
        m = common_prefix(words[:m], self._words[:m])
        while m and (ends[m - 1] == (ends[m - 2] if m > 1 else 0)
                     or self._placed.stops[m - 1] >= self._span[1]):
            m -= 1
        return m


def _ctc_confidence(alike_probs: Sequence[float | None], num_letters: int) -> float:
    """The least probability of the word's letters the CTC pass heard alike (``alike_probs``),
    times the share of its letters heard alike (0 when none; 1 when the probabilities are
    unknown)."""
    if num_letters == 0:
        return 1.0
    if not alike_probs:
        return 0.0
    known = [p for p in alike_probs if p is not None]
    least = min(known) if known else 1.0
    return least * min(1.0, len(alike_probs) / num_letters)


def _fill_gaps(spans: list[Span | None], weights: list[int], start: float, hi: int
               ) -> list[Span]:
    """Each word's (start, end) frames: its own span, or for a run of words with none, a
    share (by ``weights``) of the gap between the spans around it (``start``, the end of the
    word before the first one, and the segment's end ``hi`` at the edges)."""
    out: list[Span] = []
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
        gap_start = out[-1][1] if out else start
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
