"""The guard against the first pass: Whisper's text replaces a segment's CTC text only when
the two tell the same story.

Whisper tiny.en is the better recogniser on read speech (2 % WER against the streaming CTC
model's 44 % on the devset's read sentences), but on short, odd segments it can write fluent
text that was never said ("This is my 21-8." for "six five seven one eight eight"), and a
decode can still fail its own safeguards after the last temperature. The CTC hypothesis of
the same audio is a weak but independent witness: its spelling is often off, its words and
characters mostly line up with what was said. The guard compares the two after scoring
normalisation (``oasr.text.wer.normalize_transcript``, so "8" and "eight" agree) and keeps the
CTC text when Whisper:

- failed its safeguards after every temperature (``failed``);
- wrote more than ``max_length_ratio`` times, or less than ``1 / max_length_ratio`` times, the
  CTC pass's characters (``length``), once the CTC pass heard ``min_words`` words or more.
  Characters, not words: the CTC pass often runs words together ("she videovenivebenmadamiable
  himself" for "he might even have been made amiable himself", 3 words against 8 and 36
  characters against 37), which on a short segment made a word count reject Whisper's right
  text; a sentence Whisper left out still changes the characters as much as the words. A
  digit counts as ``DIGIT_CHARS`` characters (normalisation writes "six" as "6"), so a digit
  string the CTC pass heard with a stray word or two ("they six five two fine ...") is not
  three times longer than Whisper's digits;
- differs from it in more than ``max_char_distance`` of the characters (normalised
  Levenshtein distance; ``distance``), with the same ``min_words`` floor.

A stream's hotwords are terms the CTC pass may spell worse than Whisper, which was prompted
with them: a hotword in Whisper's text is left out of the comparison, with the CTC text's
closest span to it (``without_hotwords``), so a final is never rejected for containing one.
The other way round, the CTC pass searched with the hotwords' context graph often spells a
name exactly where Whisper, only prompted with it, writes a near miss ("Sibrenor" for
"Sibrenna"): where the CTC text has a hotword and Whisper's words at the same place are
capitalised and at least `RESPELL_SCORE` alike, Whisper's text takes the hotword
(`respell_hotwords`; the final's ``source`` is then "combined").

Digit strings are where the CTC model is strong and Whisper weak in its own way: it hears
"four" as "for" and "six" as "z", and drops a digit of a repeated run ("9 9 9 4 8" for "two nine
nine nine nine four eight"), while the CTC pass, trained on digit strings, rarely drops one but
mishears more digits on degraded audio. So on a segment whose CTC text is a digit string
(``min_digit_share`` of its words digits, ``min_digit_words`` words or more: a two-digit
segment is where Whisper writes "Hey. Hey." for "eight eight"), the two are aligned word by
word and combined
(``source`` "combined"): where they agree, or both wrote a digit, Whisper's word; where
Whisper wrote a non-digit word against a CTC digit, or left out a digit the CTC pass heard,
the CTC digit. ``docs/model.md`` has the stress-set measurement that chose the rule: it is
better than either text alone on the re-spliced, degraded and synthetic digit strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rapidfuzz import fuzz
from rapidfuzz.distance import Levenshtein

from oasr.text.wer import normalize_transcript

REASONS = ("failed", "length", "distance")
# the CTC text's span closest to a hotword Whisper wrote is the hotword's when it matches this
# well (rapidfuzz's partial ratio, 0..100)
HOTWORD_SPAN_SCORE = 50.0
# Whisper's words where the CTC text has a hotword become the hotword when at least this alike
# (rapidfuzz's ratio of their letters, 0..100: half their letters in common)
RESPELL_SCORE = 50.0
DIGIT_CHARS = 4  # a digit's length as a spoken word ("zero" ... "nine": 3-5 letters)
SOURCES = ("whisper", "ctc", "combined")


@dataclass(frozen=True)
class GuardVerdict:
    """Which text a final carries.

    Attributes:
        text: the final's text.
        source: ``"whisper"``, ``"ctc"`` or ``"combined"`` (a digit string repaired from
            both).
        reason: why Whisper's text was rejected (one of ``REASONS``); None when it was kept.
    """

    text: str
    source: str
    reason: str | None = None


@dataclass(frozen=True)
class FirstPassGuard:
    """Thresholds of the comparison (see the module docstring).

    Attributes:
        max_length_ratio: Whisper may write at most this many times the CTC pass's
            characters (spaces aside, after normalisation), and at least its reciprocal.
        max_char_distance: the most character edits per character (normalised Levenshtein
            distance between the normalised texts) Whisper may differ by; None: no distance
            check. The threshold was calibrated against a CTC pass decoded with its LMs
            (beam search with the char and word LMs, which spells real words); a first pass
            without an LM misspells too much to be a witness of distance ("tee one ei eight
            five ighigh" for a digit string Whisper got right), so the engine turns the check
            off then and keeps the word-count check.
        min_words: the word-count and distance checks apply once the CTC text has this many
            words (a one-word CTC text is too weak a witness).
        min_digit_share: a CTC text of ``min_digit_words`` or more words with at least this
            share of digits is a digit string, and Whisper's text of it is combined with it;
            None never combines.
        min_digit_words: the fewest words of a digit string (see ``min_digit_share``).
    """

    max_length_ratio: float = 2.0
    max_char_distance: float | None = 0.6
    min_words: int = 3
    min_digit_share: float | None = 0.75
    min_digit_words: int = 2

    def __post_init__(self) -> None:
        if not self.max_length_ratio >= 1.0:
            raise ValueError(
                f"FirstPassGuard.max_length_ratio must be >= 1, got {self.max_length_ratio}")
        if self.max_char_distance is not None and not 0.0 < self.max_char_distance <= 1.0:
            raise ValueError(
                f"FirstPassGuard.max_char_distance must be in (0, 1] or None, got "
                f"{self.max_char_distance}")
        if self.min_words < 1:
            raise ValueError(f"FirstPassGuard.min_words must be >= 1, got {self.min_words}")
        if self.min_digit_words < 1:
            raise ValueError(
                f"FirstPassGuard.min_digit_words must be >= 1, got {self.min_digit_words}")
        if self.min_digit_share is not None and not 0.0 < self.min_digit_share <= 1.0:
            raise ValueError(
                f"FirstPassGuard.min_digit_share must be in (0, 1] or None, got {self.min_digit_share}")

    def for_first_pass(self, has_lm: bool) -> FirstPassGuard:
        """This guard for a CTC pass decoded with LMs (``has_lm``) or without: without, no
        distance check (see ``max_char_distance``)."""
        return self if has_lm else replace(self, max_char_distance=None)

    def review(self, whisper: str, ctc: str, failed: bool = False,
               hotwords: tuple[str, ...] = ()) -> GuardVerdict:
        """The final for a segment whose CTC text is ``ctc`` and Whisper's ``whisper``
        (``hotwords``: the stream's, left out of the comparison where Whisper wrote them)."""
        reason = self.rejection(whisper, ctc, failed, hotwords)
        if reason is not None:
            return GuardVerdict(ctc, "ctc", reason)
        combined = self.combine_digits(whisper, ctc)
        if combined is not None:
            return GuardVerdict(combined, "combined")
        return GuardVerdict(whisper, "whisper")

    def rejection(self, whisper: str, ctc: str, failed: bool = False,
                  hotwords: tuple[str, ...] = ()) -> str | None:
        """Why Whisper's text must not replace the CTC text; None when it may."""
        if failed:
            return "failed"
        ours, theirs = without_hotwords(normalize_transcript(whisper),
                                        normalize_transcript(ctc), hotwords)
        if hotwords and not ours and normalize_transcript(whisper):
            return None  # Whisper wrote only the stream's hotwords
        if len(theirs) < self.min_words:
            return None
        ratio = _spoken_length(ours) / _spoken_length(theirs)
        if ratio > self.max_length_ratio or ratio < 1.0 / self.max_length_ratio:
            return "length"
        limit = self.max_char_distance
        if limit is not None and Levenshtein.normalized_distance(" ".join(ours),
                                                                 " ".join(theirs)) > limit:
            return "distance"
        return None

    def combine_digits(self, whisper: str, ctc: str) -> str | None:
        """Whisper's and the CTC pass's texts of a digit string combined word by word (see
        the module docstring); None when ``ctc`` is no digit string or the combination is
        Whisper's own words."""
        theirs = normalize_transcript(ctc).split()
        if (self.min_digit_share is None or len(theirs) < self.min_digit_words
                or sum(w.isdigit() for w in theirs) < self.min_digit_share * len(theirs)):
            return None
        ours = normalize_transcript(whisper).split()
        words: list[str] = []
        for op in Levenshtein.opcodes(ours, theirs):
            mine, other = ours[op.src_start:op.src_end], theirs[op.dest_start:op.dest_end]
            if op.tag == "equal" or op.tag == "insert":  # insert: words only the CTC pass has
                words += mine if op.tag == "equal" else [w for w in other if w.isdigit()]
                continue
            if op.tag == "delete":  # words only Whisper has
                words += mine
                continue
            for i in range(max(len(mine), len(other))):  # replace
                w = mine[i] if i < len(mine) else None
                c = other[i] if i < len(other) else None
                if w is not None and (w.isdigit() or c is None or not c.isdigit()):
                    words.append(w)
                elif c is not None and c.isdigit():
                    words.append(c)
        return None if words == ours else " ".join(words)


def without_hotwords(ours: str, theirs: str, hotwords: tuple[str, ...]
                     ) -> tuple[list[str], list[str]]:
    """The words of normalised texts ``ours`` (Whisper's) and ``theirs`` (the CTC pass's)
    with each hotword Whisper wrote taken out of both: from ``theirs`` the span closest to it
    (whole words), when it matches at least `HOTWORD_SPAN_SCORE`."""
    mine, other = ours.split(), theirs.split()
    for phrase in hotwords:
        term = normalize_transcript(phrase).split()
        if not term:
            continue
        n = len(term)
        at = next((i for i in range(len(mine) - n + 1) if mine[i:i + n] == term), None)
        while at is not None:
            del mine[at:at + n]
            _drop_closest_span(other, " ".join(term))
            at = next((i for i in range(len(mine) - n + 1) if mine[i:i + n] == term), None)
    return mine, other


def _key(word: str) -> str:
    return "".join(ch for ch in word.casefold() if ch.isalnum() or ch == "'")


def respell_hotwords(whisper: str, ctc: str, hotwords: tuple[str, ...]) -> str | None:
    """Whisper's text with the hotwords the CTC pass wrote where Whisper wrote something
    alike (see the module docstring); None when nothing changes."""
    if not hotwords or not whisper.strip() or not ctc.strip():
        return None
    mine = whisper.split()
    mine_keys = [_key(w) for w in mine]
    other = [_key(w) for w in ctc.split()]
    changed = False
    for phrase in hotwords:
        term = [_key(w) for w in phrase.split()]
        term = [k for k in term if k]
        n = len(term)
        if not n:
            continue
        for j in [j for j in range(len(other) - n + 1) if other[j:j + n] == term]:
            span = _aligned_span(mine_keys, other, j, j + n)
            if span is None:
                continue
            i1, i2 = span
            if mine_keys[i1:i2] == term or i2 - i1 > n + 1:
                continue
            initial = next((c for c in mine[i1] if c.isalpha()), "")
            if any(c.isupper() for c in phrase) and not initial.isupper():
                continue  # Whisper wrote a common word there, not a name
            if fuzz.ratio("".join(mine_keys[i1:i2]), "".join(term)) < RESPELL_SCORE:
                continue
            lead = mine[i1][:len(mine[i1]) - len(mine[i1].lstrip("\"'([{"))]
            tail = mine[i2 - 1][len(mine[i2 - 1].rstrip(".,!?;:\"')]}")):]
            words = phrase.split()
            words[0] = lead + words[0]
            words[-1] = words[-1] + tail
            mine[i1:i2] = words
            mine_keys[i1:i2] = term
            changed = True
    return " ".join(mine) if changed else None


def _aligned_span(mine: list[str], other: list[str], start: int, end: int
                  ) -> tuple[int, int] | None:
    """The words of ``mine`` aligned (Levenshtein, word by word) to ``other[start:end]``:
    of each equal or replaced stretch that overlaps it, its share (in proportion, for a
    replaced stretch of another length); None when none does."""
    first = last = None
    for op in Levenshtein.opcodes(mine, other):
        if op.tag in ("insert", "delete") or op.dest_end <= start or op.dest_start >= end:
            continue
        scale = (op.src_end - op.src_start) / (op.dest_end - op.dest_start)
        lo = op.src_start + math.floor((max(start, op.dest_start) - op.dest_start) * scale)
        hi = op.src_start + math.ceil((min(end, op.dest_end) - op.dest_start) * scale)
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    return None if first is None or last is None or last <= first else (first, last)


def _drop_closest_span(words: list[str], term: str) -> None:
    """Remove from ``words`` the run of whole words whose letters are closest to ``term``'s
    (rapidfuzz's ratio, spaces aside; a name the CTC pass heard as several words), when it
    scores at least `HOTWORD_SPAN_SCORE`."""
    key = term.replace(" ", "")
    longest = len(term.split()) + 3
    best, span = 0.0, None
    for i in range(len(words)):
        for k in range(1, min(longest, len(words) - i) + 1):
            score = fuzz.ratio("".join(words[i:i + k]), key)
            if score > best:
                best, span = score, (i, i + k)
    if span is not None and best >= HOTWORD_SPAN_SCORE:
        del words[span[0]:span[1]]


def _spoken_length(words: list[str]) -> int:
    """Characters of normalised ``words``, spaces aside, a digit as ``DIGIT_CHARS``."""
    return sum(DIGIT_CHARS if ch.isdigit() else 1 for word in words for ch in word)
