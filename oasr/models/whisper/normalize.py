"""Whisper's cased, punctuated English -> the devset's lowercase spoken-form words, for WER."""

from __future__ import annotations

import re

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
