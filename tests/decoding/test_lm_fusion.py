"""Shallow fusion of a char LM into prefix beam search."""

from __future__ import annotations

import math

import pytest
import torch

from oasr.lm import LmBuildConfig, build_char_lm, encode_sentences

from .fusion_helpers import (
    UNITS,
    V,
    assert_batched_equals_alone,
    best,
    decoder,
    random_log_probs,
    spelled,
)

TEXTS = ["the cat sat", "a cat ran", "the cat is black", "my cat", "cats and dogs",
         "the dog sat", "a kind man"]


@pytest.fixture(scope="module")
def lm():
    return build_char_lm(encode_sentences(TEXTS, UNITS), UNITS, LmBuildConfig(order=4))


def test_lm_prefers_the_in_vocabulary_spelling(lm) -> None:
    # "kat" is the acoustic argmax path; the LM has only seen "cat"
    lp = spelled([{"k": 0.55, "c": 0.4}, {}, {"a": 0.9}, {}, {"t": 0.9}, {}])
    assert best(decoder(1), lp).text == "kat"
    assert best(decoder(4), lp).text == "kat"
    assert best(decoder(4, lm, lm_weight=0.5, lm_unit_bonus=0.0), lp).text == "cat"


def test_weight_zero_equals_plain_beam_bit_for_bit(lm) -> None:
    lp = random_log_probs(3, 40, 0)
    lengths = torch.tensor([40, 17, 33])
    plain, fused = decoder(6), decoder(6, lm, lm_weight=0.0, lm_unit_bonus=0.0)
    results = []
    for dec in (plain, fused):
        state = dec.create_state(3, V)
        for start in range(0, 40, 8):  # chunk by chunk
            dec.decode_chunk(lp[:, start:start + 8], state,
                             (lengths - start).clamp(0, 8))
        results.append([dec.finalize_stream(state, b) for b in range(3)])
    assert results[0] == results[1]  # tokens, scores, timestamps: exactly equal


def test_reset_restores_sentence_start(lm) -> None:
    dec = decoder(4, lm, lm_weight=0.8, lm_unit_bonus=0.5)
    lp = random_log_probs(1, 30, 1)
    state = dec.create_state(1, V)
    dec.decode_chunk(lp, state)
    assert bool((state.lm_state != 0).any())
    dec.reset_state(state, 1, V)
    assert bool((state.lm_state == 0).all()) and bool((state.lm_score == 0).all())
    second = random_log_probs(1, 30, 2)
    dec.decode_chunk(second, state)
    fresh = dec.create_state(1, V)
    dec.decode_chunk(second, fresh)
    assert dec.finalize_stream(state) == dec.finalize_stream(fresh)


def test_fused_score_is_acoustic_plus_lm(lm) -> None:
    weight, bonus = 0.7, 0.3
    dec = decoder(4, lm, lm_weight=weight, lm_unit_bonus=bonus)
    lp = spelled([{"c": 0.9}, {}, {"a": 0.9}, {}, {"t": 0.9}, {}])
    state = dec.create_state(1, V)
    dec.decode_chunk(lp, state)
    hyp = dec.finalize_stream(state)[0]
    assert hyp.text == "cat"
    plain = decoder(4)
    plain_state = plain.create_state(1, V)
    plain.decode_chunk(lp, plain_state)
    acoustic = next(h.score for h in plain.finalize_stream(plain_state) if h.text == "cat")
    lm_lp = lm.score_sequence(hyp.tokens)  # with the sentence end
    assert hyp.score == pytest.approx(acoustic + weight * lm_lp + 3 * bonus, abs=1e-4)
    assert math.isfinite(hyp.score)


def test_batched_streams_equal_one_by_one(lm) -> None:
    assert_batched_equals_alone(lm, {"lm_weight": 0.6, "lm_unit_bonus": 1.0, "lm_word_bonus": 0.5})


def test_lm_needs_beam_search_and_the_same_units(lm) -> None:
    with pytest.raises(ValueError, match="beam_size > 1"):
        decoder(1, lm)
    dec = decoder(4, lm)
    with pytest.raises(ValueError, match=f"the LM has {V} units, the model 40"):
        dec.create_state(1, 40)
