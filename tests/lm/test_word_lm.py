"""The word unigram LM as a lexicon trie: hand-computed scores, OOV escape, file format."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from oasr.lm import WordLm, WordLmHeader, has_word_lm, load_decoder_lm, load_word_lm
from oasr.lm.word import WORD_HEADER_FILE, unigram_from_counts
from oasr.models.bundled import BUNDLED_UNITS

UNITS = list(BUNDLED_UNITS)
# A tiny corpus: "the" x5, "cat" x3, "then" x2 (10 words).
COUNTS = {"the": 5, "cat": 3, "then": 2}


@pytest.fixture(scope="module")
def lm() -> WordLm:
    words, log_probs = unigram_from_counts(COUNTS)
    return WordLm(WordLmHeader.for_units(UNITS), words, log_probs)


def test_unigram_is_relative_frequency() -> None:
    words, log_probs = unigram_from_counts({**COUNTS, "zero": 0})
    assert words == ["the", "cat", "then"]
    assert np.allclose(np.exp(log_probs), [0.5, 0.3, 0.2])


def test_in_lexicon_sentences_score_their_word_log_probs(lm: WordLm) -> None:
    assert lm.sentence_score("the") == pytest.approx(math.log(0.5), abs=1e-6)
    assert lm.sentence_score("then") == pytest.approx(math.log(0.2), abs=1e-6)
    assert lm.sentence_score("the cat then") == pytest.approx(
        math.log(0.5 * 0.3 * 0.2), abs=1e-5)
    assert lm.sentence_score("cat the", weight=0.5) == pytest.approx(
        0.5 * math.log(0.3 * 0.5), abs=1e-6)


def test_lookahead_spreads_the_word_along_its_spelling(lm: WordLm) -> None:
    tables = lm.gains_for(1.0, 0.0)
    t, h, e = (UNITS.index(c) for c in "the")
    boundary = UNITS.index("\u2581")
    s1 = int(tables.next_state[0, t])
    assert float(tables.gains[0, t]) == pytest.approx(math.log(0.7), abs=1e-6)  # the + then
    s2 = int(tables.next_state[s1, h])
    assert float(tables.gains[s1, h]) == pytest.approx(0.0, abs=1e-6)
    s3 = int(tables.next_state[s2, e])
    assert float(tables.gains[s3, boundary]) == pytest.approx(math.log(0.5 / 0.7), abs=1e-6)
    assert int(tables.next_state[s3, boundary]) == 0
    assert bool((tables.gains <= 1e-6).all())  # a partial word is never over-credited


def test_oov_word_scores_like_the_rarest_word_minus_the_penalty(lm: WordLm) -> None:
    floor = math.log(0.2)
    assert lm.sentence_score("thx", oov_penalty=2.0) == pytest.approx(floor - 2.0, abs=1e-6)
    assert lm.sentence_score("zzzzzz", oov_penalty=2.0) == pytest.approx(floor - 2.0, abs=1e-6)
    assert lm.sentence_score("th", oov_penalty=2.0) == pytest.approx(floor - 2.0, abs=1e-6)
    assert lm.sentence_score("cat zq the", weight=0.5, oov_penalty=1.0) == pytest.approx(
        0.5 * math.log(0.3) + 0.5 * floor - 1.0 + 0.5 * math.log(0.5), abs=1e-5)
    tables = lm.gains_for(1.0, 2.0)
    assert int(tables.next_state[0, UNITS.index("z")]) == lm.oov_state


def test_weight_and_penalty_zero_give_zero_tables(lm: WordLm) -> None:
    tables = lm.gains_for(0.0, 0.0)
    assert bool((tables.gains == 0).all()) and bool((tables.end_gains == 0).all())


def test_save_load_round_trip(lm: WordLm, tmp_path) -> None:
    lm.save(tmp_path)
    assert has_word_lm(tmp_path)
    loaded = load_word_lm(tmp_path)
    assert loaded.words == lm.words
    assert np.allclose(loaded.log_probs, lm.log_probs, atol=1e-4)
    assert np.array_equal(loaded.next_state, lm.next_state)
    both = load_decoder_lm(tmp_path)
    assert both.char is None and both.word is not None
    raw = json.loads((tmp_path / WORD_HEADER_FILE).read_text())
    (tmp_path / WORD_HEADER_FILE).write_text(json.dumps({**raw, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_word_lm(tmp_path)


def test_words_must_be_letters() -> None:
    with pytest.raises(ValueError, match="not a letter unit"):
        WordLm(WordLmHeader.for_units(UNITS), ["two words"], [0.0])
    with pytest.raises(FileNotFoundError, match="neither a char LM"):
        load_decoder_lm("/nonexistent")
