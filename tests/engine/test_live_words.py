"""Word times and confidence of live events (`oasr.engine.live.words`): the posteriors kept per
frame, the CTC letters' dates, and any text's words timed by the CTC letters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oasr.decoding import Hypothesis
from oasr.engine.live.words import (
    NO_LETTERS,
    Posteriors,
    ctc_letters,
    spoken_digits,
    timed_words,
)
from oasr.text.tokenizer import CharTokenizer

UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "▁", "<sos/eos>"]
TOK = CharTokenizer.from_units(UNITS)
SHIFT = 0.02


def _frames(rows: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(T, 4) ids and log-probs: each frame's listed units, then blanks."""
    ids = np.zeros((len(rows), 4), dtype=np.int64)
    lps = np.full((len(rows), 4), math.log(1e-4), dtype=np.float32)
    for t, row in enumerate(rows):
        for k, (unit, p) in enumerate(row.items()):
            ids[t, k], lps[t, k] = UNITS.index(unit), math.log(p)
    return ids, lps


def _hyp(text: str, frames: list[int]) -> Hypothesis:
    tokens = TOK.encode(text)
    assert len(tokens) == len(frames)
    return Hypothesis(tokens, text, 0.0, frames)


def test_posteriors_overwrite_frames_decoded_again_and_drop_old_ones() -> None:
    post = Posteriors()
    post.write(0, *_frames([{"a": 0.9}] * 10))
    post.write(6, *_frames([{"b": 0.8}] * 6))  # a cut at frame 6: decoded again
    assert post.end == 12
    assert post.prob(5, UNITS.index("a")) == pytest.approx(0.9)
    assert post.prob(7, UNITS.index("b")) == pytest.approx(0.8)
    assert post.prob(7, UNITS.index("a")) == pytest.approx(1e-4, rel=1e-3)  # below the best
    post.drop_before(6)
    assert post.prob(5, UNITS.index("a")) is None and post.start == 6
    assert post.peak(UNITS.index("b"), 0, 100) == (6, pytest.approx(0.8))
    assert post.peak(UNITS.index("z"), 0, 100) is None


def test_a_letter_is_dated_by_its_peak_not_by_when_its_prefix_entered_the_beam() -> None:
    # the beam search dated "h" at frame 0; its posterior peaks at frame 16
    rows = [{} for _ in range(20)]
    rows[16], rows[17] = {"h": 0.95}, {"e": 0.9}
    rows[3] = {"h": 0.01}
    post = Posteriors()
    post.write(100, *_frames(rows))
    letters = ctc_letters(TOK, _hyp("he", [0, 17]), 100, post)
    assert letters.letters == "he"
    assert letters.frames == (116, 117)
    assert letters.probs == (pytest.approx(0.95), pytest.approx(0.9))
    assert ctc_letters(TOK, None, 0) == NO_LETTERS


def _letters(text: str, frames: list[int], prob: float = 0.9):
    post = Posteriors()
    rows = [{} for _ in range(max(frames) + 2)]
    for token, frame in zip(TOK.encode(text), frames, strict=True):
        rows[frame] = {UNITS[token]: prob}
    post.write(0, *_frames(rows))
    return ctc_letters(TOK, _hyp(text, frames), 0, post)


def test_the_ctc_text_takes_its_letters_times_and_confidence() -> None:
    letters = _letters("hi you", [2, 4, 5, 10, 12, 14])
    words = timed_words("hi you", letters, (0, 20), SHIFT)
    assert [(w.word, w.start, w.end) for w in words] == [("hi", 0.04, 0.1), ("you", 0.2, 0.3)]
    assert all(w.confidence == pytest.approx(0.9) for w in words)


def test_another_spelling_is_timed_by_the_letters_it_meets() -> None:
    # the CTC pass heard "bren vic", Whisper wrote "Brenvik."
    letters = _letters("call bren vic now", [1, 2, 3, 4, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18,
                                             19, 20, 21])
    words = timed_words("Call Brenvik. Now", letters, (0, 30), SHIFT)
    assert [w.word for w in words] == ["Call", "Brenvik.", "Now"]
    assert (words[1].start, words[1].end) == (8 * SHIFT, 17 * SHIFT)
    assert words[1].confidence < words[0].confidence  # one letter heard otherwise
    assert words[2].start >= words[1].end


def test_numbers_written_in_digits_meet_their_spoken_letters() -> None:
    assert spoken_digits("1775") == "seventeenseventyfive"
    assert spoken_digits("4") == "four" and spoken_digits("2000") == "twothousand"
    letters = _letters("one four", [2, 3, 4, 5, 10, 11, 12, 13])
    words = timed_words("1 4", letters, (0, 20), SHIFT)
    assert [(w.start, w.end) for w in words] == [(0.04, 0.1), (0.2, 0.28)]


def test_words_the_ctc_pass_did_not_hear_share_the_gap_in_order_inside_the_span() -> None:
    letters = _letters("a b", [2, 3, 30])
    words = timed_words("a xx yyyy b", letters, (1, 40), SHIFT)
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    assert all(1 * SHIFT <= w.start <= w.end <= 40 * SHIFT for w in words)
    gap = [w.end - w.start for w in words[1:3]]
    assert gap[1] == pytest.approx(2 * gap[0], abs=1e-3)  # shared by length
    # nothing heard at all: the words share the segment
    spread = timed_words("one two", NO_LETTERS, (10, 20), SHIFT)
    assert spread[0].start == 0.2 and spread[-1].end == 0.4
    assert all(w.confidence == 0.0 for w in spread)


def test_whisper_probabilities_are_the_confidence_when_given() -> None:
    letters = _letters("hi you", [2, 4, 5, 10, 12, 14])
    words = timed_words("Hi, you.", letters, (0, 20), SHIFT, probs=(0.42, 0.97))
    assert [w.confidence for w in words] == [0.42, 0.97]
    assert timed_words("", letters, (0, 20), SHIFT) == ()
