"""Word bigram corrections: hand-computed estimates, scores through the trie, file format."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.lm import DecoderLm, WordLm, WordLmHeader, load_word_lm
from oasr.lm.bigram import estimate_bigrams
from oasr.lm.word import unigram_from_counts
from oasr.models.bundled import BUNDLED_UNITS
from oasr.text.tokenizer import CharTokenizer

UNITS = list(BUNDLED_UNITS)
V = len(UNITS)
SENTENCES = [["the", "cat"], ["the", "cat"], ["the", "dog"], ["a", "cat"]]


@pytest.fixture(scope="module")
def lm() -> WordLm:
    counts = {"the": 3, "cat": 3, "dog": 1, "a": 1}  # unigram: 3/8, 3/8, 1/8, 1/8
    words, log_probs = unigram_from_counts(counts)
    bigrams = estimate_bigrams(SENTENCES, words, log_probs, min_count=1, discount=0.5)
    return WordLm(WordLmHeader.for_units(UNITS), words, log_probs, bigrams)


def p_cat_after_the() -> float:
    # c(the) = 3 pairs: cat x2, dog x1 -> N1+ = 2, alpha = 0.5 * 2 / 3
    return (2 - 0.5) / 3 + (0.5 * 2 / 3) * 3 / 8


def test_bigram_estimate_matches_hand_computed_values(lm: WordLm) -> None:
    assert lm.bigrams is not None
    code = {w: i + 1 for i, w in enumerate(lm.words)}
    ratio = lm.bigrams.correction(code["the"], code["cat"])
    assert ratio == pytest.approx(math.log(p_cat_after_the() / (3 / 8)), abs=1e-5)
    # unseen pair (cat, a): back-off alpha(cat); "cat" ends sentences only, so c(cat) = 0
    assert lm.bigrams.correction(code["cat"], code["a"]) == pytest.approx(0.0)
    # sentence start: the x3, a x1 -> alpha = 0.5 * 2 / 4
    assert lm.bigrams.correction(0, code["dog"]) == pytest.approx(math.log(0.25), abs=1e-6)


def test_sentence_score_is_the_bigram_log_prob(lm: WordLm) -> None:
    start_the = (3 - 0.5) / 4 + 0.25 * 3 / 8
    expected = math.log(start_the) + math.log(p_cat_after_the())
    assert lm.sentence_score("the cat") == pytest.approx(expected, abs=1e-5)
    assert lm.sentence_score("the cat", weight=0.5) == pytest.approx(0.5 * expected, abs=1e-5)


def test_search_scores_the_bigram(lm: WordLm) -> None:
    frames = "the\u2581cat"
    probs = torch.full((2 * len(frames), V), 1e-4)
    for t, ch in enumerate(frames):
        probs[2 * t, UNITS.index(ch)] = 0.9
    probs[:, 0] = 1 - probs.sum(dim=1) + probs[:, 0]
    lp = (probs / probs.sum(1, keepdim=True)).log()[None]
    results = []
    for model in (None, DecoderLm(word=lm)):
        dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=4, lm_unit_bonus=0.0,
                                                   word_lm_weight=1.0, word_oov_penalty=0.0),
                                  CharTokenizer.from_units(UNITS), device="cpu", lm=model)
        state = dec.create_state(1, V)
        dec.decode_chunk(lp, state)
        results.append(dec.finalize_stream(state)[0])
    assert results[0].text == results[1].text == "the cat"
    assert results[1].score - results[0].score == pytest.approx(
        lm.sentence_score("the cat"), abs=1e-4)


def test_bigrams_survive_save_and_load(lm: WordLm, tmp_path) -> None:
    lm.save(tmp_path)
    loaded = load_word_lm(tmp_path)
    assert loaded.bigrams is not None and lm.bigrams is not None
    assert np.array_equal(loaded.bigrams.prev, lm.bigrams.prev)
    assert np.allclose(loaded.bigrams.log_ratio, lm.bigrams.log_ratio, atol=1e-3)
    assert loaded.sentence_score("the cat") == pytest.approx(lm.sentence_score("the cat"),
                                                             abs=1e-3)


def test_batched_streams_with_bigrams_equal_one_by_one(lm: WordLm) -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 40, V, generator=g) * 3
    logits[..., 0] += 2.0
    logits[..., UNITS.index("\u2581")] += 1.5
    lp = logits.log_softmax(-1)
    lengths = torch.tensor([40, 23, 35])
    cfg = GpuDecoderConfig(beam_size=5, word_lm_weight=0.7, word_oov_penalty=2.0)
    tok = CharTokenizer.from_units(UNITS)
    batched = GpuStreamingDecoder(cfg, tok, device="cpu", lm=DecoderLm(word=lm))
    single = GpuStreamingDecoder(cfg, tok, device="cpu", lm=DecoderLm(word=lm))
    states = [batched.create_state(1, V) for _ in range(3)]
    alone = [single.create_state(1, V) for _ in range(3)]
    for start in range(0, 40, 8):
        chunk_len = (lengths - start).clamp(0, 8)
        batched.decode_streams(lp[:, start:start + 8], states, chunk_len)
        for b in range(3):
            single.decode_chunk(lp[b:b + 1, start:start + 8], alone[b], chunk_len[b:b + 1])
    assert bool((torch.cat([s.prev_word for s in states]) != 0).any())
    assert [batched.finalize_stream(s) for s in states] == \
        [single.finalize_stream(s) for s in alone]


def test_closing_gains_are_the_weighted_corrections_of_every_pair(lm: WordLm) -> None:
    assert lm.bigrams is not None
    weight = 0.7
    tables = lm.gains_for(weight, 1.0).bigram
    assert tables is not None
    num_words = len(lm.words)
    codes = list(range(num_words + 2))  # sentence start, the words, OOV
    states = list(range(lm.num_states))  # root, trie nodes (words or not), OOV state
    prev = torch.tensor([[p for p in codes for _ in states]])
    state = torch.tensor([[s for _ in codes for s in states]])
    got = tables.closing_gains(prev, state)
    assert got.shape == prev.shape
    for p, s, value in zip(prev[0].tolist(), state[0].tolist(), got[0].tolist(), strict=True):
        code = int(lm.node_code[s])
        want = weight * lm.bigrams.correction(p, code) if code <= num_words else 0.0
        assert value == pytest.approx(want, abs=1e-5), (p, s)
