"""Word times and confidence of live events (`oasr.engine.live.words`): the posteriors kept per
frame, the CTC letters' dates, and any text's words timed by the CTC letters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oasr.decoding import Hypothesis
from oasr.engine.live.posteriors import Posteriors
from oasr.engine.live.words import (
    NO_LETTERS,
    PartialWords,
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


def _from_scratch(text: str, hyp: Hypothesis, post: Posteriors, span: tuple[int, int]):
    return timed_words(text, ctc_letters(TOK, hyp, span[0], post), span, SHIFT)


def test_partial_words_match_the_words_computed_from_scratch_as_the_beam_revises() -> None:
    # the segment starts at frame 4; each token peaks a frame or two after its date
    rows = [{} for _ in range(40)]
    for frame, unit, p in [(6, "h", 0.9), (8, "e", 0.8), (9, "y", 0.7), (8, "i", 0.6),
                           (11, "▁", 0.9), (15, "y", 0.95), (17, "o", 0.85), (19, "u", 0.9),
                           (21, "▁", 0.9), (24, "t", 0.8), (26, "o", 0.7), (28, "o", 0.75)]:
        rows[frame] = {**rows[frame], unit: p}
    steps = [  # (partial's text, CTC hypothesis, its tokens' dates in the segment, decoded)
        ("he", "he", [1, 3], 12),
        ("hey yo", "hey yo", [1, 3, 4, 6, 10, 12], 20),
        ("hey you", "hey you", [1, 3, 4, 6, 10, 12, 14], 20),  # the last word grew
        ("hi you", "hi you", [1, 3, 6, 10, 12, 14], 28),  # the beam revised the first word
        ("hi you", "hi you", [1, 3, 6, 10, 12, 14], 28),  # its frames decoded again, below:
        ("hi you", "hi you", [1, 3, 6, 10, 12, 14], 28),  # "i" peaks earlier, then "h" is less sure
        ("hi you to", "hi you to", [1, 3, 6, 10, 12, 14, 16, 19, 21], 36),
        ("hi you too", "hi you too", [1, 3, 6, 10, 12, 14, 16, 19, 21, 23], 36),
        ("hi there", "hi you too", [1, 3, 6, 10, 12, 14, 16, 19, 21, 23], 36),  # refined
    ]
    post, partial_words = Posteriors(), PartialWords(TOK)
    got = []
    for n, (text, ctc_text, dates, end) in enumerate(steps):
        if n in (4, 5):
            if n == 4:  # "i" now peaks at frame 7, as sure
                rows[7], rows[8] = {"i": 0.6}, {"i": 0.3, "e": 0.9}
            else:  # "h" still peaks at frame 6, less sure
                rows[6] = {"h": 0.4}
            post.write(4, *_frames(rows[4:end]))
        else:
            post.write(post.end, *_frames(rows[post.end:end]))
        hyp, span = _hyp(ctc_text, dates), (4, end)
        got.append(partial_words.words(text, hyp, post, span, SHIFT))
        assert got[-1] == _from_scratch(text, hyp, post, span), steps[n]
    assert [w.word for w in got[3]] == ["hi", "you"]
    assert got[4][0].end < got[3][0].end and got[4][1] == got[3][1]  # nothing stale kept
    assert got[5][0].confidence < got[4][0].confidence and got[5][1] == got[4][1]
    assert got[7][:2] == got[6][:2] and got[7][2].word == "too"


def test_a_word_held_at_the_segments_end_is_timed_again_when_the_end_moves() -> None:
    # frames decoded past the partial's end (a cut's frames not decoded again yet): "you"'s
    # letters peak after it, so the word is held at the end until the end moves past them
    rows = [{} for _ in range(24)]
    rows[2], rows[3], rows[5], rows[13], rows[14], rows[16] = (
        {"h": 0.9}, {"e": 0.9}, {"y": 0.9}, {"y": 0.9}, {"o": 0.9}, {"u": 0.9})
    post, partial_words = Posteriors(), PartialWords(TOK)
    post.write(0, *_frames(rows))
    hyp = _hyp("hey you", [1, 2, 4, 6, 12, 13, 15])
    held = partial_words.words("hey you", hyp, post, (0, 12), SHIFT)
    assert held[1].start == held[1].end == 12 * SHIFT
    moved = partial_words.words("hey you", hyp, post, (0, 20), SHIFT)
    assert moved == _from_scratch("hey you", hyp, post, (0, 20))
    assert moved[1].end == 17 * SHIFT


def test_peaks_reused_from_the_last_call_match_a_fresh_search() -> None:
    rows = [{} for _ in range(30)]
    rows[3], rows[5], rows[6], rows[12] = {"a": 0.9}, {"b": 0.8}, {"b": 0.85}, {"c": 0.7}
    post = Posteriors()
    post.write(0, *_frames(rows[:10]))
    tokens = [UNITS.index(u) for u in "abc"]
    assert post.peaks(tokens[:2], [2, 4], reuse=True) == post.peaks(tokens[:2], [2, 4])
    post.write(10, *_frames(rows[10:20]))  # the last token's window grew
    assert post.peaks(tokens, [2, 4, 11], reuse=True) == post.peaks(tokens, [2, 4, 11])
    rows[5] = {"b": 0.99}
    post.write(5, *_frames(rows[5:20]))  # decoded again from frame 5
    fresh = post.peaks(tokens, [2, 4, 11])
    assert post.peaks(tokens, [2, 4, 11], reuse=True) == fresh
    assert fresh[0][1] == 5 and fresh[1][1] == pytest.approx(0.99)
    post.drop_before(4)
    assert post.peaks(tokens, [2, 4, 11], reuse=True) == post.peaks(tokens, [2, 4, 11])


def test_peaks_match_each_tokens_own_peak_on_random_posteriors() -> None:
    """`Posteriors.peaks` (all tokens' windows in one compiled pass) against `peak` token by
    token: a token's window runs from its date to the next token's (the last one
    `MAX_PEAK_FRAMES` on); without a hit, or with a NaN log-prob among its hits, it keeps its
    date and `prob` there."""
    from oasr.engine.live.posteriors import MAX_PEAK_FRAMES

    rng = np.random.default_rng(0)
    for trial in range(40):
        num_frames = int(rng.integers(1, 60))
        ids = rng.integers(0, 6, size=(num_frames, 4))
        lps = np.log(rng.random((num_frames, 4))).astype(np.float32)
        if trial % 5 == 0:
            lps[rng.integers(num_frames), rng.integers(4)] = np.nan
        post = Posteriors()
        start = int(rng.integers(0, 4))
        post.write(start, ids, lps)
        count = int(rng.integers(1, 8))
        stamps = sorted(rng.choice(np.arange(start + num_frames + 5), count, replace=False).tolist())
        tokens = rng.integers(0, 6, size=count).tolist()
        frames, probs = post.peaks(tokens, stamps)
        ends = stamps[1:] + [stamps[-1] + MAX_PEAK_FRAMES]
        for i, (token, date, end) in enumerate(zip(tokens, stamps, ends, strict=True)):
            rows = range(max(date, start) - start, min(end, start + num_frames) - start)
            hits = [lps[r, j] for r in rows for j in range(4) if ids[r, j] == token]
            want = post.peak(token, date, end)
            if want is None or any(np.isnan(hits)):
                fallback = post.prob(date, token)
                assert frames[i] == date
                assert probs[i] == fallback or math.isnan(probs[i]) and math.isnan(fallback)
            else:
                assert (frames[i], probs[i]) == (want[0], pytest.approx(want[1], rel=1e-6))


def test_a_word_without_letters_is_placed_again_with_the_word_after_it() -> None:
    # "-" spells no letter: it shares the gap up to the next word, which the beam revised
    rows = [{} for _ in range(30)]
    for frame, unit in [(2, "h"), (3, "e"), (4, "y"), (12, "y"), (13, "o"), (8, "o"),
                        (9, "h"), (16, "y"), (17, "o"), (18, "u")]:
        rows[frame] = {**rows[frame], unit: 0.9}
    post, partial_words = Posteriors(), PartialWords(TOK)
    post.write(0, *_frames(rows))
    steps = [("hey - yo", _hyp("hey yo", [2, 3, 4, 6, 12, 13]), (0, 15)),
             ("hey - oh you", _hyp("hey oh you", [2, 3, 4, 6, 8, 9, 11, 16, 17, 18]), (0, 20))]
    got = [partial_words.words(text, hyp, post, span, SHIFT) for text, hyp, span in steps]
    assert got == [_from_scratch(text, hyp, post, span) for text, hyp, span in steps]
    assert got[1][1].end < got[0][1].end  # "-" ends where "oh" begins


def test_words_kept_only_for_the_same_segment_start() -> None:
    # the same frames, a segment that starts later: its first word begins at its start
    rows = [{} for _ in range(20)]
    rows[2], rows[3], rows[8], rows[9] = {"h": 0.9}, {"e": 0.9}, {"y": 0.9}, {"o": 0.9}
    post, partial_words = Posteriors(), PartialWords(TOK)
    post.write(0, *_frames(rows))
    first = partial_words.words("he yo", _hyp("he yo", [2, 3, 5, 8, 9]), post, (0, 20), SHIFT)
    later = _hyp("he yo", [-2, -1, 1, 4, 5])
    got = partial_words.words("he yo", later, post, (4, 20), SHIFT)
    assert got == _from_scratch("he yo", later, post, (4, 20)) != first
    assert got[0].start == 4 * SHIFT
