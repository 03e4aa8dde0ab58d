"""The per-chunk tables and per-frame helpers of the prefix beam search, and the fused search
against a plain-Python reference that ranks prefixes by acoustic + LM score."""

from __future__ import annotations

import pytest
import torch

from oasr.decoding import GpuDecoderConfig
from oasr.decoding.beam_tables import ScoreLayout, candidate_tables
from oasr.decoding.lm_fusion import LmFusion
from oasr.decoding.search import INT_FIELDS, _find_children, pack_ints, prepare_chunk
from oasr.decoding.state import hash_append, new_state
from oasr.lm import DecoderLm, LmBuildConfig, WordLm, WordLmHeader, build_char_lm, encode_sentences
from oasr.lm.bigram import estimate_bigrams
from oasr.lm.word import unigram_from_counts

from .fusion_helpers import UNITS, V, decoder, random_log_probs
from .reference import NEG, logadd

BOUNDARY = UNITS.index("\u2581")
TEXTS = ["the cat sat", "a cat ran", "the cat is black", "my cat", "the dog sat", "a dog ran"]


@pytest.fixture(scope="module")
def both() -> DecoderLm:
    char = build_char_lm(encode_sentences(TEXTS, UNITS), UNITS, LmBuildConfig(order=3))
    words, log_probs = unigram_from_counts({"the": 4, "cat": 4, "sat": 2, "dog": 2, "a": 2})
    sentences = [t.split() for t in TEXTS]
    bigrams = estimate_bigrams(sentences, words, log_probs, min_count=1, discount=0.5)
    return DecoderLm(char, WordLm(WordLmHeader.for_units(UNITS), words, log_probs, bigrams))


def test_score_layout_maps_each_ranked_entry_to_its_hypothesis_and_candidate() -> None:
    k, c = 3, 4
    layout = ScoreLayout.build(k, c, torch.device("cpu"))
    assert layout.blocks.tolist() == [0, 5, 10]
    assert layout.scratch.tolist() == [4, 9, 14]
    for i in range(k):  # a stay continues its own hypothesis
        assert (layout.parent[i], layout.column[i], layout.slot[i], layout.moved[i]) == (i, 0, 0, 0)
    for i in range(k, k + k * c):
        hyp, col = divmod(i - k, c)
        assert (layout.parent[i], layout.column[i], layout.moved[i]) == (hyp, col, i - k)
        assert layout.slot[i] == hyp * (c + 1) + col  # never a block's scratch column


def chunk_of(lp: torch.Tensor, beam: int):
    config = GpuDecoderConfig(beam_size=beam)
    state = new_state(lp.shape[0], beam, 8, 0, torch.device("cpu"))
    return prepare_chunk(lp, None, state, config), config


def test_candidate_tables_give_each_token_its_column_and_a_scratch_slot() -> None:
    lp = random_log_probs(2, 5, 0)
    chunk, config = chunk_of(lp, 3)
    frames = candidate_tables(chunk, config)
    assert len(frames) == 5
    for t, frame in enumerate(frames):
        num_cand = frame.tokens.shape[1]
        assert num_cand == config.num_candidates(V) + 1  # the best tokens, blank or spare included
        assert frame.lp[:, 1:].equal(lp[:, t]) and frame.lp_blank.equal(lp[:, t, 0])
        for b in range(2):
            tokens = frame.tokens[b].tolist()
            assert len(set(tokens)) == num_cand
            for v in range(V):
                expected = tokens.index(v) if v in tokens else num_cand
                assert frame.slot[b, v + 1] == expected
            assert frame.slot[b, 0] == num_cand  # the empty prefix has no last token
            assert frame.log_probs[b, num_cand] == NEG
            allowed = [j for j, v in enumerate(tokens) if v != 0][: config.num_candidates(V)]
            for j, v in enumerate(tokens):
                want = lp[b, t, v].item() if j in allowed else NEG
                assert frame.log_probs[b, j].item() == want


def state_with_prefixes(prefixes: list[tuple[int, ...]], alive: list[bool]):
    """A 1-row state holding ``prefixes`` (dead ones with -inf scores)."""
    state = new_state(1, len(prefixes), 8, 0, torch.device("cpu"))
    for k, prefix in enumerate(prefixes):
        h = torch.tensor(0)
        for tok in prefix:
            h = hash_append(h, torch.tensor(tok))
        state.prefix_hash[0, k] = h
        state.prefix_len[0, k] = len(prefix)
        state.last_token[0, k] = prefix[-1] if prefix else -1
        state.log_pb[0, k] = -1.0 - k if alive[k] else NEG
    return state


def test_children_are_the_live_one_token_extensions_of_live_prefixes() -> None:
    prefixes = [(), (3,), (3, 4), (3, 4, 4), (5,), (3, 5), (4,), (3, 4), (7, 3)]
    alive = [True, True, True, True, True, False, True, False, True]
    state = state_with_prefixes(prefixes, alive)
    total = state.log_pb.clone()
    lp_last = torch.full_like(total, -0.5)
    children = _find_children(state, total, lp_last, state.last_token + 1)
    for c, child in enumerate(prefixes):
        parents = [p for p, parent in enumerate(prefixes)
                   if alive[p] and alive[c] and child and parent == child[:-1]]
        assert bool(children.has_parent[0, c]) == bool(parents), (c, child)
        if parents:
            p = parents[0]
            assert children.parent[0, c] == p
            repeat = prefixes[p] and prefixes[p][-1] == child[-1]
            via = state.log_pb[0, p] if repeat else total[0, p]
            assert children.merged[0, c].item() == pytest.approx(via.item() - 0.5)
        else:
            assert children.merged[0, c] == NEG


def test_packed_ints_are_the_fields_and_the_fields_views_of_them() -> None:
    state = new_state(2, 3, 8, 0, torch.device("cpu"))
    for i, name in enumerate(INT_FIELDS):
        setattr(state, name, torch.arange(6).view(2, 3) * (i + 1))
    ints = pack_ints(state)
    assert ints.shape == (2, len(INT_FIELDS), 3)
    for i, name in enumerate(INT_FIELDS):
        assert ints[:, i].equal(torch.arange(6).view(2, 3) * (i + 1))
        ints[:, i] += 1  # the field sees it: a view, not a copy
        assert getattr(state, name).equal(torch.arange(6).view(2, 3) * (i + 1) + 1)


def fusion_for(both: DecoderLm, **weights: float) -> LmFusion:
    config = GpuDecoderConfig(beam_size=4, **weights).resolved()
    return LmFusion.build(both, config, torch.device("cpu"), BOUNDARY)


def prefix_lm_score(fusion: LmFusion, prefix: tuple[int, ...]) -> float:
    """The fused LM score of ``prefix`` walked unit by unit through the fusion's tables."""
    word = fusion.word
    assert word is not None and word.bigram is not None
    state = wstate = prev = 0
    total = 0.0
    for tok in prefix:
        total += float(fusion.gains[state, tok]) + float(word.gains[wstate, tok])
        if bool(word.closers[tok]):
            total += float(word.bigram.closing_gains(torch.tensor(prev), torch.tensor(wstate)))
            if wstate != 0:
                prev = int(word.bigram.node_code[wstate])
        state = int(fusion.next_state[state, tok])
        wstate = int(word.next_state[wstate, tok])
    return total


def fused_reference(lp: list[list[float]], beam: int, fusion: LmFusion) -> list[tuple]:
    """Textbook CTC prefix beam search ranking prefixes by acoustic + fused LM score; returns
    (prefix, acoustic log-prob) best first (without the sentence end)."""
    lm: dict[tuple[int, ...], float] = {}

    def score(prefix: tuple[int, ...]) -> float:
        if prefix not in lm:
            lm[prefix] = prefix_lm_score(fusion, prefix)
        return lm[prefix]

    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, NEG)}
    for frame in lp:
        nxt: dict[tuple[int, ...], list[float]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = logadd(pb, pnb)
            entry = nxt.setdefault(prefix, [NEG, NEG])
            entry[0] = logadd(entry[0], total + frame[0])
            if prefix:
                entry[1] = logadd(entry[1], pnb + frame[prefix[-1]])
            for c in range(1, len(frame)):
                base = pb if prefix and prefix[-1] == c else total
                new = nxt.setdefault(prefix + (c,), [NEG, NEG])
                new[1] = logadd(new[1], base + frame[c])
        ranked = sorted(nxt.items(), key=lambda kv: -(logadd(*kv[1]) + score(kv[0])))[:beam]
        beams = {p: (v[0], v[1]) for p, v in ranked}
    out = [(p, logadd(pb, pnb), logadd(pb, pnb) + score(p)) for p, (pb, pnb) in beams.items()]
    return sorted(out, key=lambda x: -x[2])


@pytest.mark.parametrize("seed", range(3))
def test_fused_search_equals_a_plain_python_reference(both: DecoderLm, seed: int) -> None:
    # beam 16: 2 * 16 + 1 candidates hold every unit, so the LM cannot reach a token the
    # search did not consider, and the reference may try them all
    weights = {"lm_weight": 0.5, "lm_unit_bonus": 1.0, "word_lm_weight": 0.7,
               "word_oov_penalty": 1.5}
    dec = decoder(16, both, **weights)
    fusion = fusion_for(both, **weights)
    lp = random_log_probs(2, 9, 40 + seed, boundary_boost=2.0)
    lengths = torch.tensor([9, 6])
    state = dec.create_state(2, V)
    dec.decode_chunk(lp, state, lengths)
    for b in range(2):
        ref = fused_reference(lp[b, : int(lengths[b])].double().tolist(), 16, fusion)
        live = torch.logaddexp(state.log_pb[b], state.log_pnb[b]) > NEG
        got = {}
        for k in torch.nonzero(live).flatten().tolist():
            prefix = tuple(state.tokens[b, k, : int(state.prefix_len[b, k])].tolist())
            got[prefix] = (torch.logaddexp(state.log_pb[b, k], state.log_pnb[b, k]).item(),
                           state.lm_score[b, k].item())
        assert set(got) == {p for p, _, _ in ref}
        for prefix, acoustic, _ in ref:
            assert got[prefix][0] == pytest.approx(acoustic, abs=1e-4)
            assert got[prefix][1] == pytest.approx(prefix_lm_score(fusion, prefix), abs=1e-4)


def test_extension_scores_and_states_follow_the_tables(both: DecoderLm) -> None:
    fusion = fusion_for(both, lm_weight=0.5, lm_unit_bonus=1.0, word_lm_weight=0.7,
                       word_oov_penalty=1.5)
    word = fusion.word
    assert word is not None and word.bigram is not None and fusion.closer_ids is not None
    g = torch.Generator().manual_seed(3)
    state = new_state(2, 3, 8, 0, torch.device("cpu"))
    state.lm_state = torch.randint(0, fusion.gains.shape[0], (2, 3), generator=g)
    state.word_state = torch.randint(0, word.gains.shape[0], (2, 3), generator=g)
    state.prev_word = torch.randint(0, word.bigram.oov_code + 1, (2, 3), generator=g)
    state.lm_score = torch.randn(2, 3, generator=g)
    cand = torch.stack([torch.randperm(V, generator=g)[:7] for _ in range(2)])  # (B, C)
    cand[0, 2], cand[1, 5] = BOUNDARY, V - 1  # closers among the candidates
    scores = fusion.extension_scores(state, cand)
    assert scores.shape == (2, 3, 7)
    out = torch.empty(2, 3, 7)
    assert fusion.extension_scores(state, cand, out=out) is out and out.equal(scores)
    closing = word.bigram.closing_gains(state.prev_word, state.word_state)
    for b in range(2):
        for k in range(3):
            s, w = int(state.lm_state[b, k]), int(state.word_state[b, k])
            for j, tok in enumerate(cand[b].tolist()):
                want = state.lm_score[b, k] + fusion.gains[s, tok] + word.gains[w, tok]
                if bool(word.closers[tok]):
                    want = want + closing[b, k]
                assert scores[b, k, j].item() == pytest.approx(want.item(), abs=1e-5)
    token = torch.randint(1, V, (2, 3), generator=g)
    token[0, 0] = BOUNDARY
    moved = fusion.extended_states(state.lm_state, state.word_state, state.prev_word, token)
    for b in range(2):
        for k in range(3):
            s, w, tok = int(state.lm_state[b, k]), int(state.word_state[b, k]), int(token[b, k])
            assert moved[0][b, k] == fusion.next_state[s, tok]
            assert moved[1][b, k] == word.next_state[w, tok]
            closes = bool(word.closers[tok]) and w != 0
            want = word.bigram.node_code[w] if closes else state.prev_word[b, k]
            assert moved[2][b, k] == want
