"""Transcript scoring: normalisation and word / character error rates.

One implementation for every place that scores transcripts: the recipe's evaluations, the
benchmarks and the tests.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

_DIGIT_WORDS = {word: str(i) for i, word in enumerate(
    ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"))}


@functools.cache
def _english_normalizer() -> Callable[[str], str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


_DIGIT_RUN = re.compile(r"[\d.,]*\d[\d.,]*")


def normalize_transcript(text: str) -> str:
    """Text as it is scored: Whisper's English text normaliser (lowercase, punctuation and
    fillers removed, contractions and British spellings made standard, number words written
    as numbers: "nineteen eighty four" -> "1984"), then every number split into its digits
    ("1984" -> "1 9 8 4", "9.72" -> "9 7 2") and the digit words the normaliser leaves
    ("one") written as digits.

    So "8 5 6", "856", "eight five six" and "eight hundred fifty six" all score as "8 5 6": a
    final is never wrong for writing a number one way and the reference another, and a digit
    string is scored digit by digit, as its reference words are counted.
    """
    words: list[str] = []
    for word in _english_normalizer()(text).split():
        if word in _DIGIT_WORDS:
            words.append(_DIGIT_WORDS[word])
        elif _DIGIT_RUN.fullmatch(word):
            words.extend(ch for ch in word if ch.isdigit())
        else:
            words.append(word)
    return " ".join(words)


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
        """Count one utterance; both texts are normalised first (``normalize_transcript``)."""
        ref, hyp = normalize_transcript(ref), normalize_transcript(hyp)
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
