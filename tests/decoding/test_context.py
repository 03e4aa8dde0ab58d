"""Hotwords: parsing and limits, spelling in the units, the context graph's scores, and the
CTC prefix beam search biased by per-stream graphs."""

from __future__ import annotations

import random

import pytest
import torch

from oasr.decoding.context import (
    MAX_HOTWORDS,
    MAX_PHRASE_CHARS,
    ContextGraph,
    Hotword,
    HotwordError,
    Hotwords,
    parse_hotwords,
    split_terms,
    term_tokens,
)
from oasr.text.tokenizer import CharTokenizer
from tests.decoding.fusion_helpers import UNITS, V, decoder, spelled

TOK = CharTokenizer.from_units(UNITS)
B = UNITS.index("\u2581")


# -- parsing and limits ------------------------------------------------------------------------
def test_parse_takes_strings_and_objects_and_merges_repeats() -> None:
    terms = parse_hotwords(["  Oyelaran ", {"phrase": "Ljubljana", "boost": 3}, "oyelaran",
                            {"phrase": "OYELARAN", "boost": 4.5}])
    assert terms == (Hotword("Oyelaran", 4.5), Hotword("Ljubljana", 3.0))
    assert parse_hotwords(None) == ()
    assert split_terms(" Brenvik, ,Taloria ,") == ["Brenvik", "Taloria"]


@pytest.mark.parametrize("value, message", [
    ("Oyelaran", "must be a list"),
    ([f"w{i}" for i in range(MAX_HOTWORDS + 1)], f"at most {MAX_HOTWORDS}"),
    (["  "], "is empty"),
    (["x" * (MAX_PHRASE_CHARS + 1)], f"at most {MAX_PHRASE_CHARS}"),
    ([{"phrase": "a", "boost": 0}], "boost 0"),
    ([{"phrase": "a", "boost": 11}], "boost 11"),
    ([{"phrase": "a", "boost": float("nan")}], "boost nan"),
    ([{"phrase": "a", "boost": True}], "boost True"),
    ([{"phrase": "a", "weight": 2}], "unknown fields ['weight']"),
    ([{"boost": 2}], "phrase must be a string"),
    ([3], "must be a string"),
])
def test_parse_refuses_with_a_message_naming_the_term(value, message) -> None:
    with pytest.raises(HotwordError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_hotwords(value)


def test_char_spelling_folds_case_accents_and_breaks() -> None:
    assert TOK.decode(term_tokens(TOK, "Zoë Anna-Lee")) == "zoe anna lee"
    assert term_tokens(TOK, "Zoë")[-1] == B  # every term ends at a word boundary
    assert term_tokens(TOK, "O'Brien,") == TOK.encode("o'brien") + [B]
    with pytest.raises(HotwordError, match="cannot write '2'"):
        term_tokens(TOK, "R2D2")
    with pytest.raises(HotwordError, match="nothing the model can speak"):
        term_tokens(TOK, "?!")


def test_hotwords_prompt_lists_the_terms_after_the_prompt() -> None:
    hot = Hotwords.build(["Brenvik", "Taloria"], TOK, prompt="Meeting notes.")
    assert hot.whisper_prompt() == "Meeting notes. Glossary: Brenvik, Taloria."
    assert hot.graph is not None and hot.graph.terms == hot.terms
    assert Hotwords.build(["Brenvik"]).graph is None  # no tokenizer: no first-pass graph
    assert not Hotwords.build(None)


# -- the graph's scores ------------------------------------------------------------------------
def score(graph: ContextGraph, text: str) -> float:
    return graph.score(TOK.encode(text))


def test_a_term_earns_its_boost_per_token_only_when_complete() -> None:
    graph = ContextGraph.build(parse_hotwords([{"phrase": "anna", "boost": 2.0}]), TOK)
    assert score(graph, "anna") == pytest.approx(10.0)  # a n n a + boundary
    assert score(graph, "i met anna today") == pytest.approx(10.0)
    assert score(graph, "ann") == 0.0  # a partial match costs nothing and earns nothing
    assert score(graph, "annabel") == 0.0  # a longer word is not the term
    assert score(graph, "banana") == 0.0  # nor a word that contains it
    assert score(graph, "anna anna") == pytest.approx(20.0)


def _reference_score(seq: list[int], terms: list[list[int]], boost: float) -> float:
    """Every occurrence of a term at a word start (the sequence's end counts as a boundary),
    each worth its tokens after the longest shorter term that is its prefix."""
    padded = seq + [B]
    total = 0.0
    for i in range(len(seq)):
        if i and seq[i - 1] != B:
            continue
        for term in terms:
            if padded[i:i + len(term)] == term and i + len(term) <= len(seq) + 1:
                shorter = [len(t) for t in terms if len(t) < len(term) and term[:len(t)] == t]
                total += (len(term) - max(shorter, default=0)) * boost
    return total


def test_graph_scores_match_a_direct_count_on_random_sequences() -> None:
    rng = random.Random(7)
    letters = [UNITS.index(c) for c in "abc"]
    for trial in range(200):
        words = {tuple(rng.choice(letters) for _ in range(rng.randint(1, 3)))
                 for _ in range(rng.randint(1, 4))}
        terms = [list(w) + [B] for w in words]
        if rng.random() < 0.5:  # a two-word term whose first word may be a term too
            first = rng.choice(sorted(words))
            terms.append(list(first) + [B] + [rng.choice(letters)] + [B])
        graph = ContextGraph.from_tokens([Hotword(f"t{i}", 1.5) for i in range(len(terms))],
                                         terms, V, B)
        for _ in range(20):
            seq = [rng.choice(letters + [B]) for _ in range(rng.randint(0, 12))]
            assert graph.score(seq) == pytest.approx(_reference_score(seq, terms, 1.5)), (
                trial, terms, seq)


def test_shared_prefixes_take_the_larger_boost() -> None:
    graph = ContextGraph.build(parse_hotwords([{"phrase": "ab", "boost": 1.0},
                                               {"phrase": "ac", "boost": 3.0}]), TOK)
    assert score(graph, "ab") == pytest.approx(3.0 + 1.0 + 1.0)  # "a" shared at 3.0
    assert score(graph, "ac") == pytest.approx(9.0)


# -- the search --------------------------------------------------------------------------------
def _misheard_name() -> torch.Tensor:
    """ "tal" then a vowel the model hears as "e" more than "o" (but not by much), then "ra":
    the acoustics prefer "talera", the name is "talora"."""
    frames = [{"t": 0.9}, {"a": 0.9}, {"l": 0.9}, {"e": 0.5, "o": 0.4}, {"r": 0.9}, {"a": 0.9}]
    return spelled([f for frame in frames for f in (frame, {})])


def _final(dec, lp: torch.Tensor, graph: ContextGraph | None) -> str:
    state = dec.create_state(1, V)
    dec.set_context(state, graph)
    dec.decode_chunk(lp, state)
    text = dec.finalize_stream(state)[0].text
    dec.free_state(state)
    return text


def test_a_hotword_wins_over_a_slightly_likelier_spelling() -> None:
    dec = decoder(4)
    graph = ContextGraph.build(parse_hotwords(["Talora"]), TOK)
    assert _final(dec, _misheard_name(), None) == "talera"
    assert _final(dec, _misheard_name(), graph) == "talora"
    other = ContextGraph.build(parse_hotwords(["Brenvik", "Quenmarsh"]), TOK)
    assert _final(dec, _misheard_name(), other) == "talera"  # unrelated terms change nothing


def test_an_unrelated_graph_leaves_hypotheses_and_scores_as_they_were() -> None:
    lp = torch.randn(1, 40, V).mul(3).log_softmax(-1)
    plain, biased = decoder(5), decoder(5)
    graph = ContextGraph.build(parse_hotwords(["qqqq"]), TOK)  # q never a candidate here
    a = plain.create_state(1, V)
    b = biased.create_state(1, V)
    biased.set_context(b, graph)
    lp[..., UNITS.index("q")] = -1e4
    for start in range(0, 40, 8):
        plain.decode_chunk(lp[:, start:start + 8], a)
        biased.decode_chunk(lp[:, start:start + 8], b)
        assert plain.partial(a) == biased.partial(b)
    assert plain.finalize_stream(a) == biased.finalize_stream(b)


def test_rows_with_different_graphs_decode_as_each_alone() -> None:
    lp = torch.cat([_misheard_name()] * 3)
    graphs = [ContextGraph.build(parse_hotwords(["Talora"]), TOK), None,
              ContextGraph.build(parse_hotwords(["Talera", "Tilora"]), TOK)]
    batched, single = decoder(4), decoder(4)
    states = [batched.create_state(1, V) for _ in graphs]
    for state, graph in zip(states, graphs, strict=True):
        batched.set_context(state, graph)
    batched.decode_streams(lp, states)
    finals = [batched.finalize_stream(s)[0] for s in states]
    alone = []
    for b, graph in enumerate(graphs):
        state = single.create_state(1, V)
        single.set_context(state, graph)
        single.decode_chunk(lp[b:b + 1], state)
        alone.append(single.finalize_stream(state)[0])
        single.free_state(state)
    assert finals == alone
    assert [h.text for h in finals] == ["talora", "talera", "talera"]


def test_changing_the_graph_applies_from_the_next_chunk_and_survives_a_reset() -> None:
    dec = decoder(4)
    graph = ContextGraph.build(parse_hotwords(["Talora"]), TOK)
    state = dec.create_state(1, V)
    dec.decode_chunk(_misheard_name(), state)
    assert dec.finalize_stream(state)[0].text == "talera"  # decoded before the change
    dec.reset_state(state, 1, V)
    dec.set_context(state, graph)
    dec.decode_chunk(_misheard_name(), state)
    assert dec.finalize_stream(state)[0].text == "talora"
    dec.reset_state(state, 1, V)
    dec.decode_chunk(_misheard_name(), state)
    assert dec.finalize_stream(state)[0].text == "talora"  # kept through the reset
    dec.set_context(state, None)
    dec.reset_state(state, 1, V)
    dec.decode_chunk(_misheard_name(), state)
    assert dec.finalize_stream(state)[0].text == "talera"


def test_a_partial_match_taken_back_when_the_graph_changes() -> None:
    dec = decoder(4)
    state = dec.create_state(1, V)
    dec.set_context(state, ContextGraph.build(parse_hotwords(["talorax"]), TOK))
    dec.decode_chunk(_misheard_name(), state)
    partial_score = dec.partial(state).score
    dec.set_context(state, ContextGraph.build(parse_hotwords(["brenvik"]), TOK))
    assert dec.partial(state).score < partial_score  # the "tal..." credit is gone
    plain = decoder(4)
    ref = plain.create_state(1, V)
    plain.decode_chunk(_misheard_name(), ref)
    acoustic = {h.text: h.score for h in plain.finalize_stream(ref)}
    kept = [h for h in dec.finalize_stream(state) if h.text in acoustic]
    assert kept
    for hyp in kept:  # no credit left: each scores as without hotwords
        assert hyp.score == pytest.approx(acoustic[hyp.text], abs=1e-3)


def test_hotwords_need_beam_search() -> None:
    dec = decoder(1)
    state = dec.create_state(1, V)
    with pytest.raises(ValueError, match="beam search"):
        dec.set_context(state, ContextGraph.build(parse_hotwords(["anna"]), TOK))
    dec.set_context(state, None)  # none is fine


def test_freeing_a_state_releases_its_graph() -> None:
    dec = decoder(4)
    graph = ContextGraph.build(parse_hotwords(["anna"]), TOK)
    a, b = dec.create_state(1, V), dec.create_state(1, V)
    dec.set_context(a, graph)
    dec.set_context(b, graph)
    dec.free_state(a)
    assert dec._contexts is not None and dec._contexts.in_use
    dec.free_state(b)
    assert not dec._contexts.in_use
