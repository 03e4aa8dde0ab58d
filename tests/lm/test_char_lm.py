"""Char n-gram LM: hand-computed smoothing, normalisation, back-off states, the file format."""

from __future__ import annotations

import math

import pytest
import torch

from oasr.lm import LmBuildConfig, build_char_lm, encode_sentences, has_char_lm, load_char_lm
from oasr.lm.model import LOG_PROB_FLOOR
from oasr.models.bundled import BUNDLED_UNITS

TINY_UNITS = ("<blank>", "a", "b", "<sos/eos>")
A, B, END = 1, 2, 3
TINY_CORPUS = [[A, B], [A]]  # <s> a b </s>, <s> a </s>


def state_of(lm, history: list[int]) -> int:
    """State id of a context (unit ids, oldest first)."""
    code = 0
    for unit in history:
        code = code * (lm.vocab_size + 1) + unit + 1
    found = (lm.codes == code).nonzero()
    assert len(found) == 1, f"context {history} is not a state"
    return int(found[0, 0])


def prob(lm, history: list[int], unit: int) -> float:
    return math.exp(float(lm.log_probs[state_of(lm, history), unit]))


def test_witten_bell_matches_hand_computed_values() -> None:
    lm = build_char_lm(TINY_CORPUS, TINY_UNITS, LmBuildConfig(order=2, smoothing="witten_bell"))
    # unigrams: counts a 2, b 1, </s> 2 (5 tokens, 3 types), uniform 1/3 below them
    assert prob(lm, [], A) == pytest.approx(3 / 8)
    assert prob(lm, [], B) == pytest.approx(2 / 8)
    assert prob(lm, [], END) == pytest.approx(3 / 8)
    # after <s>: a twice (1 type): (c + 1 * P_uni) / (2 + 1)
    assert prob(lm, [END], A) == pytest.approx(19 / 24)
    assert prob(lm, [END], B) == pytest.approx(1 / 12)
    # after a: b once, </s> once (2 types): (c + 2 * P_uni) / (2 + 2)
    assert prob(lm, [A], B) == pytest.approx(3 / 8)
    assert prob(lm, [A], A) == pytest.approx(3 / 16)
    assert prob(lm, [A], END) == pytest.approx(7 / 16)
    expected = math.log(19 / 24) + math.log(3 / 8) + math.log(11 / 16)  # a b </s>
    assert lm.score_sequence([A, B]) == pytest.approx(expected, rel=1e-6)


def test_kneser_ney_matches_hand_computed_values() -> None:
    lm = build_char_lm(TINY_CORPUS, TINY_UNITS, LmBuildConfig(order=2, smoothing="kneser_ney"))
    # continuation counts a 1 ({<s>}), b 1 ({a}), </s> 2 ({a, b}); D1 = 2 / (2 + 2 * 1)
    assert prob(lm, [], A) == pytest.approx(0.25)
    assert prob(lm, [], B) == pytest.approx(0.25)
    assert prob(lm, [], END) == pytest.approx(0.5)
    # bigram counts <s>a 2, ab 1, a</s> 1, b</s> 1: D2 = 3 / (3 + 2 * 1) = 0.6
    assert prob(lm, [END], A) == pytest.approx(1.4 / 2 + 0.6 * 1 / 2 * 0.25)
    assert prob(lm, [END], B) == pytest.approx(0.6 * 1 / 2 * 0.25)
    assert prob(lm, [A], B) == pytest.approx(0.4 / 2 + 0.6 * 2 / 2 * 0.25)
    assert prob(lm, [A], A) == pytest.approx(0.6 * 2 / 2 * 0.25)
    assert prob(lm, [], 0) == pytest.approx(0.0, abs=1e-30)  # the blank is never predicted


def test_pruned_context_backs_off_to_its_longest_kept_suffix() -> None:
    corpus = [[A, B, A], [B, A], [B, A]]
    lm = build_char_lm(corpus, TINY_UNITS, LmBuildConfig(order=3, min_context_count=2))
    kept = {tuple(h) for h in ([A, B], [B, A], [END, B])
            if (lm.codes == sum((u + 1) * 5 ** (1 - i) for i, u in enumerate(h))).any()}
    assert kept == {(B, A), (END, B)}  # "a b" occurs once as a context: pruned
    # <s> a -> (<s> a occurs once: pruned) the longest kept suffix "a"; then b -> "a b" is
    # pruned too -> "b"
    after_a = int(lm.next_state[lm.start_state, A])
    assert after_a == state_of(lm, [A])
    assert int(lm.next_state[after_a, B]) == state_of(lm, [B])
    assert int(lm.next_state[state_of(lm, [B]), A]) == state_of(lm, [B, A])
    assert int(lm.next_state[state_of(lm, [B, A]), END]) == lm.start_state


@pytest.mark.parametrize("smoothing", ["kneser_ney", "witten_bell"])
def test_every_state_is_a_distribution(smoothing: str, tmp_path) -> None:
    texts = ["the cat sat on the mat", "a dog's life", "the dogs barked", "cats and dogs"] * 3
    units = BUNDLED_UNITS
    lm = build_char_lm(encode_sentences(texts, units), units,
                       LmBuildConfig(order=5, smoothing=smoothing, min_context_count=2))
    sums = lm.log_probs.double().exp().sum(dim=1)  # (S,)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
    lm.save(tmp_path)
    assert has_char_lm(tmp_path)
    loaded = load_char_lm(tmp_path)
    sums = loaded.log_probs.double().exp().sum(dim=1)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
    assert torch.equal(loaded.next_state, lm.next_state)
    assert loaded.header == lm.header
    live = lm.log_probs > LOG_PROB_FLOOR
    assert torch.equal(live, loaded.log_probs > LOG_PROB_FLOOR)
    assert (loaded.log_probs - lm.log_probs)[live].abs().max() < 0.1  # 0.1-nat levels


def test_load_refuses_another_format(tmp_path) -> None:
    lm = build_char_lm(TINY_CORPUS, TINY_UNITS, LmBuildConfig(order=2))
    lm.save(tmp_path)
    header = tmp_path / "char_lm.json"
    header.write_text(header.read_text().replace('"version": 1', '"version": 9'))
    with pytest.raises(ValueError, match="version 9"):
        load_char_lm(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_char_lm(tmp_path / "missing")


def test_unit_mismatch_is_reported() -> None:
    lm = build_char_lm(TINY_CORPUS, TINY_UNITS, LmBuildConfig(order=2))
    lm.check_units(TINY_UNITS)
    with pytest.raises(ValueError, match="first difference at id 2"):
        lm.check_units(("<blank>", "a", "c", "<sos/eos>"))
