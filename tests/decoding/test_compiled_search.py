"""The compiled CPU beam search against the tensor search: the same live hypotheses (prefixes,
frames, LM states, scores), partials and finals, with and without LMs, hotwords, padding,
thresholds, and with rows split over threads."""

from __future__ import annotations

import math

import numba
import pytest
import torch

from oasr.decoding import GpuStreamingDecoder, compiled_search
from oasr.decoding.context import ContextGraph, parse_hotwords
from oasr.decoding.search import INT_FIELDS, prepare_chunk
from oasr.lm import DecoderLm, LmBuildConfig, WordLm, WordLmHeader, build_char_lm, encode_sentences
from oasr.lm.bigram import estimate_bigrams
from oasr.lm.word import unigram_from_counts
from oasr.text.tokenizer import CharTokenizer

from .fusion_helpers import UNITS, V, decoder, random_log_probs, spelled

TEXTS = ["the cat sat", "a cat ran", "the cat is black", "my cat", "the dog sat", "a dog ran"]


@pytest.fixture(scope="module")
def both() -> DecoderLm:
    char = build_char_lm(encode_sentences(TEXTS, UNITS), UNITS, LmBuildConfig(order=3))
    words, log_probs = unigram_from_counts({"the": 4, "cat": 4, "sat": 2, "dog": 2, "a": 2})
    bigrams = estimate_bigrams([t.split() for t in TEXTS], words, log_probs, min_count=1,
                               discount=0.5)
    return DecoderLm(char, WordLm(WordLmHeader.for_units(UNITS), words, log_probs, bigrams))


def live_hypotheses(dec: GpuStreamingDecoder, state, row: int) -> dict[tuple[int, ...], tuple]:
    """Row ``row``'s live hypotheses by prefix: (token frames, integer fields, log_pb,
    log_pnb, lm_score)."""
    out = {}
    for k in range(state.beam_size):
        pb, pnb = state.log_pb[row, k].item(), state.log_pnb[row, k].item()
        if pb == -math.inf and pnb == -math.inf:
            continue
        n = int(state.prefix_len[row, k])
        prefix = tuple(state.tokens[row, k, :n].tolist())
        assert prefix not in out, "two live hypotheses hold the same prefix"
        out[prefix] = (tuple(state.token_frames[row, k, :n].tolist()),
                       tuple(int(getattr(state, f)[row, k]) for f in INT_FIELDS),
                       pb, pnb, state.lm_score[row, k].item())
    return out


def assert_same_beams(compiled: GpuStreamingDecoder, tensor: GpuStreamingDecoder, a, b,
                      rows: int) -> None:
    for row in range(rows):
        got, want = live_hypotheses(compiled, a, row), live_hypotheses(tensor, b, row)
        assert got.keys() == want.keys()
        for prefix, (frames, ints, *scores) in got.items():
            frames_w, ints_w, *scores_w = want[prefix]
            assert (frames, ints) == (frames_w, ints_w)
            assert scores == pytest.approx(scores_w, abs=1e-4, rel=1e-5)


def run_pair(lm, cfg: dict, batch: int, frames: int, chunk: int, seed: int,
             lengths: list[int] | None = None, hotwords: list[str] | None = None,
             beam: int = 6) -> None:
    """Decode the same log-probs with both searches, chunk by chunk, comparing the beams
    after every chunk, the partials, and the finals."""
    compiled = decoder(beam, lm, compiled_search=True, **cfg)
    tensor = decoder(beam, lm, compiled_search=False, **cfg)
    assert compiled._search_tables is not None and tensor._search_tables is None
    lp = random_log_probs(batch, frames, seed, boundary_boost=1.0)
    total = torch.tensor(lengths if lengths is not None else [frames] * batch)
    sa = [compiled.create_state(1, V) for _ in range(batch)]
    sb = [tensor.create_state(1, V) for _ in range(batch)]
    if hotwords:
        tok = CharTokenizer.from_units(UNITS)
        graph = ContextGraph.build(parse_hotwords(hotwords), tok)
        for i in range(0, batch, 2):  # every other stream: rows with and without a graph
            compiled.set_context(sa[i], graph)
            tensor.set_context(sb[i], graph)
    for start in range(0, frames, chunk):
        valid = (total - start).clamp(0, chunk)
        compiled.decode_streams(lp[:, start:start + chunk], sa, valid)
        tensor.decode_streams(lp[:, start:start + chunk], sb, valid)
        for x, y in zip(sa, sb, strict=True):
            assert_same_beams(compiled, tensor, x, y, 1)
        for got, want in zip(compiled.partials(sa), tensor.partials(sb), strict=True):
            assert (got.hypothesis.tokens, got.hypothesis.timestamps, got.stats) == \
                (want.hypothesis.tokens, want.hypothesis.timestamps, want.stats)
            assert got.hypothesis.score == pytest.approx(want.hypothesis.score, abs=1e-3)
    for x, y in zip(sa, sb, strict=True):
        got, want = compiled.finalize_stream(x), tensor.finalize_stream(y)
        assert [h.tokens for h in got] == [h.tokens for h in want]
        assert [h.timestamps for h in got] == [h.timestamps for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_search_matches_the_tensor_search(seed: int) -> None:
    run_pair(None, {}, batch=5, frames=40, chunk=16, seed=seed, lengths=[40, 33, 17, 40, 1])


@pytest.mark.parametrize("with_words", [False, True])
def test_fused_search_matches_the_tensor_search(both: DecoderLm, with_words: bool) -> None:
    lm = both if with_words else DecoderLm(char=both.char)
    run_pair(lm, {}, batch=4, frames=48, chunk=16, seed=3, lengths=[48, 30, 41, 7])


def test_large_lm_gains_are_not_pruned_away(both: DecoderLm) -> None:
    """Bigram corrections far above the acoustic gaps (the word LM's weight 4): the bound
    that stops scoring a hypothesis's less likely candidates must count them (these seeds
    lose words when it does not)."""
    cfg = {"word_lm_weight": 4.0, "lm_weight": 0.2, "lm_unit_bonus": 0.5, "word_oov_penalty": 0.0}
    for seed, beam in ((16, 2), (31, 2), (26, 4)):
        run_pair(both, cfg, batch=4, frames=40, chunk=20, seed=seed, beam=beam)


def test_hotwords_with_and_without_lms_match_the_tensor_search(both: DecoderLm) -> None:
    run_pair(None, {}, batch=4, frames=40, chunk=8, seed=5, hotwords=["cat", "sat down"])
    run_pair(both, {}, batch=4, frames=40, chunk=8, seed=6, hotwords=["dog", "black cat"])


def test_thresholds_and_penalties_match_the_tensor_search(both: DecoderLm) -> None:
    cfg = {"top_k": 3, "min_token_log_prob": -2.5, "blank_penalty": 0.5}
    run_pair(both, cfg, batch=3, frames=40, chunk=10, seed=7)
    run_pair(None, {"top_k": 1}, batch=3, frames=24, chunk=24, seed=8, beam=3)


def test_rows_split_over_threads_match_the_tensor_search(both: DecoderLm) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        batch = 4 * compiled_search.ROWS_PER_PIECE + 3  # pieces for three threads, one short
        run_pair(both, {}, batch=batch, frames=24, chunk=12, seed=9,
                 lengths=[24 - (i % 24) for i in range(batch)], beam=4)
    finally:
        torch.set_num_threads(threads)


def test_the_tensor_search_runs_where_asked_and_for_greedy() -> None:
    assert decoder(4, compiled_search=False)._search_tables is None
    assert decoder(1)._search_tables is None  # greedy search has no beam
    assert decoder(4)._search_tables is not None  # the CPU default


def test_equal_scores_go_to_the_earlier_candidate() -> None:
    """Three units exactly as likely, beam 2: the beam keeps the extensions by the two that
    come first among the frame's candidates (the order ``topk`` gives them), in
    that order (the partial is the first of equal hypotheses)."""
    lp = spelled([{"a": 0.3, "b": 0.3, "c": 0.3}])
    dec = decoder(2)
    state = dec.create_state(1, V)
    candidates = prepare_chunk(lp, None, state, dec.config).top_tokens
    order = [UNITS[i] for i in candidates[0, 0].tolist() if UNITS[i] in "abc"]
    dec.decode_chunk(lp, state)
    assert sorted(h.text for h in dec.finalize_stream(state)) == sorted(order[:2])
    assert dec.partial(state).text == order[0]


def test_a_function_numba_cannot_cache_is_compiled_uncached() -> None:
    """Where no cache directory can be written (here: a function without a source file),
    the search still compiles instead of failing its import."""
    namespace: dict = {}
    exec(compile("def twice(x):\n    return 2 * x\n", "<no file>", "exec"), namespace)
    with pytest.raises(RuntimeError, match="cannot cache"):
        numba.njit(cache=True)(namespace["twice"])
    assert compiled_search.jit()(namespace["twice"])(21) == 42

