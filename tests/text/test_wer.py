"""Scoring: Whisper's English normaliser, numbers split into digits, WER bookkeeping."""

import pytest

from oasr.text.wer import ErrorCounts, normalize_transcript, word_error_rate


@pytest.mark.parametrize("text", ["eight five six", "8 5 6", "856", "8, 5, 6.",
                                  "eight hundred fifty six", "Eight-five-six"])
def test_a_number_scores_the_same_however_it_is_written(text: str) -> None:
    assert normalize_transcript(text) == "8 5 6"


def test_normaliser_keeps_words_and_standardises_text() -> None:
    assert normalize_transcript("Mr. Dashwood, ill-disposed!") == "mister dashwood ill disposed"
    assert normalize_transcript("He was born in nineteen eighty four.") == "he was born in 1 9 8 4"
    assert normalize_transcript("the 21st of March") == "the 21st of march"
    assert normalize_transcript("no one came") == "no 1 came"  # digit words, both sides alike
    assert normalize_transcript("") == ""


def test_word_error_rate_counts_digits_one_by_one() -> None:
    assert word_error_rate("six five seven one eight eight", "6, 5, 7, 1, 8, 8.") == 0.0
    assert word_error_rate("six five seven one eight eight", "657189") == pytest.approx(1 / 6)
    assert word_error_rate("six five seven one eight eight", "This is my 21-8.") == \
        pytest.approx(5 / 6)  # "this is my 2 1 8" vs "6 5 7 1 8 8": 3 subs, 1 ins, 1 del


def test_error_counts_normalise_both_sides() -> None:
    counts = ErrorCounts()
    counts.add("three one three", "3, 1, 3.")
    counts.add("on the mat", "On a mat today.")
    assert (counts.word_errors, counts.words, counts.utterances) == (2, 6, 2)
    assert counts.wer == pytest.approx(100 * 2 / 6)
