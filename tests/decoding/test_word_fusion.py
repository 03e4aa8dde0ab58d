"""A word lexicon LM fused into prefix beam search (with and without the char LM)."""

from __future__ import annotations

import math

import pytest
import torch

from oasr.lm import (
    DecoderLm,
    LmBuildConfig,
    WordLm,
    WordLmHeader,
    build_char_lm,
    encode_sentences,
)
from oasr.lm.word import unigram_from_counts

from .fusion_helpers import (
    UNITS,
    V,
    assert_batched_equals_alone,
    best,
    decoder,
    random_log_probs,
    spelled,
)

TEXTS = ["the cat sat", "a cat ran", "the cat is black", "my cat", "the dog sat"]


@pytest.fixture(scope="module")
def word_lm() -> WordLm:
    words, log_probs = unigram_from_counts({"the": 4, "cat": 3, "sat": 2, "dog": 1, "a": 2})
    return WordLm(WordLmHeader.for_units(UNITS), words, log_probs)


@pytest.fixture(scope="module")
def char_lm():
    return build_char_lm(encode_sentences(TEXTS, UNITS), UNITS, LmBuildConfig(order=3))


def test_lexicon_prefers_the_in_vocabulary_spelling(word_lm) -> None:
    lp = spelled([{"k": 0.55, "c": 0.4}, {}, {"a": 0.9}, {}, {"t": 0.9}, {}])
    assert best(decoder(4), lp).text == "kat"
    words_only = DecoderLm(word=word_lm)
    no_bonus = {"lm_unit_bonus": 0.0}
    assert best(decoder(4, words_only, word_lm_weight=0.0, word_oov_penalty=2.0,
                        **no_bonus), lp).text == "cat"
    assert best(decoder(4, words_only, word_lm_weight=0.0, word_oov_penalty=0.0,
                        **no_bonus), lp).text == "kat"  # no word score: the acoustics decide


def test_oov_escape_keeps_a_clear_unknown_word(word_lm) -> None:
    # "zq" is clearly spoken and no lexicon word comes close: the OOV path wins, penalised
    lp = spelled([{"z": 0.97}, {}, {"q": 0.97}, {}])
    lm = DecoderLm(word=word_lm)
    hyp = best(decoder(4, lm, word_lm_weight=1.0, word_oov_penalty=1.0, lm_unit_bonus=0.0), lp)
    assert hyp.text == "zq"
    acoustic = best(decoder(4), lp)
    floor = math.log(1 / 12)  # the rarest word, "dog": 1 of 12
    assert hyp.score == pytest.approx(acoustic.score + floor - 1.0, abs=1e-4)


def test_fused_score_adds_the_word_log_probs(word_lm) -> None:
    lp = spelled([{"t": 0.9}, {"h": 0.9}, {"e": 0.9}, {"\u2581": 0.9}, {"c": 0.9}, {},
                  {"a": 0.9}, {"t": 0.9}])
    lm = DecoderLm(word=word_lm)
    hyp = best(decoder(4, lm, word_lm_weight=0.5, word_oov_penalty=3.0, lm_unit_bonus=0.1), lp)
    assert hyp.text == "the cat"
    plain = decoder(4)
    state = plain.create_state(1, V)
    plain.decode_chunk(lp, state)
    acoustic = next(h.score for h in plain.finalize_stream(state) if h.text == "the cat")
    expected = acoustic + 0.5 * math.log(4 / 12 * 3 / 12) + 7 * 0.1
    assert hyp.score == pytest.approx(expected, abs=1e-4)


def test_zero_word_weight_and_penalty_equal_the_char_lm_alone(char_lm, word_lm) -> None:
    lp = random_log_probs(3, 40, 0, boundary_boost=1.0)
    lengths = torch.tensor([40, 17, 33])
    cfg = {"lm_weight": 0.7, "lm_unit_bonus": 1.0, "word_lm_weight": 0.0,
           "word_oov_penalty": 0.0}
    results = []
    for dec in (decoder(6, char_lm, **cfg), decoder(6, DecoderLm(char_lm, word_lm), **cfg)):
        state = dec.create_state(3, V)
        for start in range(0, 40, 8):
            dec.decode_chunk(lp[:, start:start + 8], state, (lengths - start).clamp(0, 8))
        results.append([dec.finalize_stream(state, b) for b in range(3)])
    assert results[0] == results[1]


def test_reset_restores_the_word_start(char_lm, word_lm) -> None:
    dec = decoder(4, DecoderLm(char_lm, word_lm), word_lm_weight=0.5, word_oov_penalty=2.0)
    lp = random_log_probs(1, 30, 1, boundary_boost=1.0)
    state = dec.create_state(1, V)
    dec.decode_chunk(lp, state)
    assert bool((state.word_state != 0).any())
    dec.reset_state(state, 1, V)
    assert bool((state.word_state == 0).all()) and bool((state.lm_score == 0).all())
    second = random_log_probs(1, 30, 2, boundary_boost=1.0)
    dec.decode_chunk(second, state)
    fresh = dec.create_state(1, V)
    dec.decode_chunk(second, fresh)
    assert dec.finalize_stream(state) == dec.finalize_stream(fresh)


def test_batched_streams_equal_one_by_one(char_lm, word_lm) -> None:
    lm = DecoderLm(char_lm, word_lm)
    assert_batched_equals_alone(lm, {"lm_weight": 0.6, "lm_unit_bonus": 1.0, "word_lm_weight": 0.4,
           "word_oov_penalty": 3.0})


def test_units_must_match(char_lm, word_lm) -> None:
    other = WordLm(WordLmHeader.for_units([*UNITS[:-1], "x", UNITS[-1]]), ["a"], [0.0])
    with pytest.raises(ValueError, match="word LM is over"):
        DecoderLm(char_lm, other)
    with pytest.raises(ValueError, match="beam_size > 1"):
        decoder(1, DecoderLm(word=word_lm))
