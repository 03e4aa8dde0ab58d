"""Prefix beam search against exact enumeration and a plain-Python reference search."""

import math

import pytest
import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder

from .reference import brute_force_prefix_log_probs, prefix_beam_search


def random_log_probs(
    seed: int, batch: int, frames: int, vocab: int, scale: float = 2.0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(batch, frames, vocab, generator=g)).log_softmax(-1)


def decode(beam: int, lp: torch.Tensor, **cfg: object) -> list:
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam, **cfg), device="cpu")
    state = dec.create_state(1, lp.shape[-1])
    dec.decode_chunk(lp[None], state)
    return dec.finalize_stream(state)


@pytest.mark.parametrize(
    ("frames", "vocab", "beam"), [(4, 3, 31), (4, 3, 40), (3, 4, 40), (5, 3, 63)]
)
@pytest.mark.parametrize("seed", range(4))
def test_exact_beam_equals_brute_force(frames: int, vocab: int, beam: int, seed: int) -> None:
    lp = random_log_probs(seed, 1, frames, vocab)[0]
    exact = brute_force_prefix_log_probs(lp.double().tolist(), blank=0)
    hyps = decode(beam, lp)
    # Every label sequence with non-zero probability fits in the beam: all of them come back.
    assert len(hyps) == len(exact)
    best_prefix = max(exact, key=exact.__getitem__)
    assert tuple(hyps[0].tokens) == best_prefix
    assert hyps[0].score == pytest.approx(exact[best_prefix], abs=1e-4)
    for h in hyps:
        assert h.score == pytest.approx(exact[tuple(h.tokens)], abs=1e-4)
    assert math.log(sum(math.exp(h.score) for h in hyps)) == pytest.approx(0.0, abs=1e-4)


@pytest.mark.parametrize("beam", [2, 3, 5, 8])
@pytest.mark.parametrize("seed", range(5))
def test_pruned_beam_equals_reference_search(beam: int, seed: int) -> None:
    lp = random_log_probs(100 + seed, 1, 9, 6)[0]
    ref = prefix_beam_search(lp.double().tolist(), beam, blank=0)
    hyps = decode(beam, lp)
    assert [tuple(h.tokens) for h in hyps] == [r[0] for r in ref]
    assert [h.score for h in hyps] == pytest.approx([r[1] for r in ref], abs=1e-4)
    assert [tuple(h.timestamps) for h in hyps] == [r[2] for r in ref]
    exact_scores = brute_force_prefix_log_probs(lp[:6].double().tolist(), blank=0)
    assert exact_scores  # the pruned search can only lose paths, never invent them:
    short = decode(beam, lp[:6])
    for h in short:
        assert h.score <= exact_scores[tuple(h.tokens)] + 1e-5


def test_candidate_limit_is_exact_on_a_large_vocabulary() -> None:
    # 2 * beam + 1 candidate tokens per frame must give the same beam as the full vocabulary.
    lp = random_log_probs(7, 1, 12, 40, scale=1.0)[0]
    ref = prefix_beam_search(lp.double().tolist(), 4, blank=0)
    hyps = decode(4, lp)
    assert [tuple(h.tokens) for h in hyps] == [r[0] for r in ref]
    assert [h.score for h in hyps] == pytest.approx([r[1] for r in ref], abs=1e-4)


def test_nbest_and_blank_id() -> None:
    lp = random_log_probs(3, 1, 8, 5)[0]
    ref = prefix_beam_search(lp.double().tolist(), 6, blank=2)
    hyps = decode(6, lp, blank_id=2, nbest=3)
    assert len(hyps) == 3
    assert [tuple(h.tokens) for h in hyps] == [r[0] for r in ref[:3]]
    assert all(2 not in h.tokens for h in hyps)


def test_min_token_log_prob_prunes_extensions() -> None:
    lp = torch.full((6, 4), -20.0)
    lp[:, 0] = 0.0
    lp[2, 3] = -0.5
    lp[2, 0] = -2.0
    hyps = decode(3, lp, min_token_log_prob=-5.0)
    assert hyps[0].tokens == [3] and hyps[0].timestamps == [2]
    assert {tuple(h.tokens) for h in hyps} == {(3,), ()}
    loose = decode(3, lp)
    assert len(loose) == 3


def test_top_k_one_only_extends_with_the_frame_best_token() -> None:
    lp = random_log_probs(11, 1, 10, 6)[0]
    for h in decode(4, lp, top_k=1):
        best_non_blank = lp[:, 1:].argmax(-1) + 1
        assert all(tok == best_non_blank[t] for tok, t in zip(h.tokens, h.timestamps, strict=True))
