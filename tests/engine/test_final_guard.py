"""The guard against the first pass: when Whisper's text may replace the CTC text."""

from __future__ import annotations

import pytest

from oasr.engine.second_pass.guard import FirstPassGuard, GuardVerdict


@pytest.fixture()
def guard() -> FirstPassGuard:
    return FirstPassGuard()


def test_agreeing_texts_keep_whisper(guard: FirstPassGuard) -> None:
    ctc = "he was not an ill disposd yung man"  # the CTC pass's spelling is often off
    assert guard.review("He was not an ill-disposed young man.", ctc) == GuardVerdict(
        "He was not an ill-disposed young man.", "whisper")
    assert guard.review("8, 5, 6.", "eight five six").source == "whisper"
    assert guard.review("Call 911 now.", "call nine one one now").source == "whisper"


def test_a_failed_decode_keeps_the_ctc_text(guard: FirstPassGuard) -> None:
    verdict = guard.review("the the the", "the cat sat on the mat", failed=True)
    assert verdict == GuardVerdict("the cat sat on the mat", "ctc", "failed")


def test_runaway_or_missing_words_are_rejected(guard: FirstPassGuard) -> None:
    ctc = "six five seven one eight eight"
    assert guard.rejection("I take 0, " + "1, " * 30, ctc) == "length"
    assert guard.rejection("Six.", ctc) == "length"
    assert guard.rejection("", ctc) == "length"


def test_words_the_ctc_pass_ran_together_are_no_length_mismatch(guard: FirstPassGuard) -> None:
    # 3 CTC "words" against Whisper's 8: a word count said "length"; the characters agree
    ctc = "she videovenivebenmadamiable himself"
    whisper = "He might even have been made amiable himself."
    assert guard.review(whisper, ctc) == GuardVerdict(whisper, "whisper")
    # a digit string with stray CTC words: a digit counts as a spoken word's letters
    assert guard.review("six, five, two, nine, six, zero, five.",
                        "they six five two fine six eight one five").source == "combined"
    # a sentence Whisper left out is still too few characters
    ctc = "ask what you can do for your country and mister john dashwood had then leisure"
    assert guard.rejection("Ask what you can do for your country.", ctc) == "length"


def test_a_different_story_is_rejected(guard: FirstPassGuard) -> None:
    ctc = "the weather is nice today so we will walk to the park"
    assert guard.rejection("I don't know what you're talking about, my friend.", ctc) == "distance"


def test_digit_strings_are_combined_word_by_word(guard: FirstPassGuard) -> None:
    ctc = "two six six two five"
    # Whisper's non-digit words against CTC digits take the CTC digit
    assert guard.review("2, z, z, 2, 5.", ctc) == GuardVerdict("2 6 6 2 5", "combined")
    assert guard.review("for 8,9,5,9,9.", "four eight nine five nine nine").text == "4 8 9 5 9 9"
    # a digit Whisper left out of a repeated run is put back
    assert guard.review("9 9 9 4 8", "two nine nine nine nine four eight").text == "2 9 9 9 9 4 8"
    # where both wrote a digit, Whisper's stands: its text is kept as written
    assert guard.review("1, 1, 2, 4", "one five two four") == GuardVerdict("1, 1, 2, 4", "whisper")
    assert guard.review("2, 6, 6, 2, 5.", ctc) == GuardVerdict("2, 6, 6, 2, 5.", "whisper")
    # not a digit string: no combination
    assert guard.combine_digits("Please call me Mac at 9114",
                                "please call me back at nine one one four two") is None
    assert FirstPassGuard(min_digit_share=None).combine_digits("2, z, z, 2, 5.", ctc) is None
    assert guard.rejection("This is my 21-8.", "six five seven one eight eight") == "distance"


def test_two_digit_segments_are_combined_one_digit_is_not(guard: FirstPassGuard) -> None:
    # Whisper's words for a short run of digits ("Hey. Hey." for "eight eight")
    assert guard.review("Hey. Hey.", "eight eight") == GuardVerdict("8 8", "combined")
    assert guard.review("Thanks. Thanks.", "six six") == GuardVerdict("6 6", "combined")
    assert guard.review("2, 8", "two eight") == GuardVerdict("2, 8", "whisper")
    assert guard.review("Hey.", "eight") == GuardVerdict("Hey.", "whisper")  # one word: no witness
    assert FirstPassGuard(min_digit_words=3).review("Hey. Hey.", "eight eight").source == "whisper"
    with pytest.raises(ValueError, match="min_digit_words must be >= 1"):
        FirstPassGuard(min_digit_words=0)


def test_short_ctc_texts_are_no_witness(guard: FirstPassGuard) -> None:
    assert guard.rejection("Thank you very much for coming today.", "a") is None
    assert guard.rejection("Hello there.", "") is None


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="max_length_ratio must be >= 1"):
        FirstPassGuard(max_length_ratio=0.5)
    with pytest.raises(ValueError, match=r"max_char_distance must be in \(0, 1\]"):
        FirstPassGuard(max_char_distance=0.0)
    with pytest.raises(ValueError, match="min_words must be >= 1"):
        FirstPassGuard(min_words=0)


def test_a_first_pass_without_an_lm_gets_no_distance_check() -> None:
    guard = FirstPassGuard(max_length_ratio=3.0)
    assert guard.for_first_pass(has_lm=True) is guard
    loose = guard.for_first_pass(has_lm=False)
    assert loose.max_char_distance is None and loose.max_length_ratio == 3.0
