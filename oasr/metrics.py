"""Evaluation metrics: transcript normalisation and word / character error rates.

One implementation for every place that scores transcripts: the recipe's evaluations, the
benchmarks and the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def number_words(n: int) -> str:
    """0 <= n < 1000 as English words ("forty two", "three hundred five")."""
    if not 0 <= n < 1000:
        raise ValueError(f"number_words handles 0..999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    rest = "" if n % 100 == 0 else " " + number_words(n % 100)
    return _ONES[n // 100] + " hundred" + rest


def _spell_number(match: re.Match[str]) -> str:
    digits = match.group(0)
    if len(digits) > 3:
        return " ".join(_ONES[int(d)] for d in digits)
    return number_words(int(digits))


def normalize_transcript(text: str) -> str:
    """Lowercase words: abbreviations expanded, numbers spelled, hyphens split, punctuation
    (but apostrophes inside words) removed, whitespace collapsed."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"\b(mr|mrs|dr|st)\.", lambda m: _ABBREVIATIONS[m.group(1)], text)
    text = re.sub(r"\d+", lambda m: f" {_spell_number(m)} ", text)
    text = re.sub(r"[^a-z' ]+", " ", text)
    text = re.sub(r"(?<![a-z])'|'(?![a-z])", " ", text)
    return " ".join(text.split())


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two token sequences (substitution, insertion, deletion = 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


@dataclass
class ErrorCounts:
    """Accumulated word and character errors over a test set."""

    word_errors: int = 0
    words: int = 0
    char_errors: int = 0
    chars: int = 0
    utterances: int = 0

    def add(self, ref: str, hyp: str) -> None:
        self.word_errors += edit_distance(ref.split(), hyp.split())
        self.words += len(ref.split())
        self.char_errors += edit_distance(list(ref), list(hyp))
        self.chars += len(ref)
        self.utterances += 1

    @property
    def wer(self) -> float:
        """Word error rate in percent (0 when there are no reference words)."""
        return 100.0 * self.word_errors / max(self.words, 1)

    @property
    def cer(self) -> float:
        return 100.0 * self.char_errors / max(self.chars, 1)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER (a fraction) of ``hypothesis`` against ``reference``, both normalised first."""
    ref = normalize_transcript(reference).split()
    hyp = normalize_transcript(hypothesis).split()
    return edit_distance(ref, hyp) / max(len(ref), 1)
