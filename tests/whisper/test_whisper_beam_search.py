"""Beam search on dense per-group buffers: beam 1 is greedy, and beam 5 gives CTranslate2's
beam-5 tokens and scores on real recordings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from whisper_devset import rows_named
from whisper_testutil import TINY_SPEC, tiny_encoded, tiny_model

from oasr.models.whisper import DecoderKv, WhisperCheckpoint, greedy_decode
from oasr.models.whisper.decoding import beam_search, best_candidates
from oasr.models.whisper.transcriber import WhisperDecodeConfig, WhisperTranscriber


@torch.inference_mode()
def test_beam_of_one_is_greedy_and_wider_beams_score_no_worse() -> None:
    model = tiny_model(seed=31)
    with torch.no_grad():
        model.decoder.embedding.weight[TINY_SPEC.eot] *= 3.0
    cross = model.decoder.cross_kv(tiny_encoded(4, seed=32))
    greedy = greedy_decode(model, TINY_SPEC, DecoderKv(cross, 14), 4, 12)
    beam1 = beam_search(model, TINY_SPEC, DecoderKv(cross, 14), 1, 12)
    assert [list(h.tokens) for h in beam1] == greedy
    beam4 = beam_search(model, TINY_SPEC, DecoderKv(cross, 14), 4, 12)
    assert all(wide.score >= narrow.score - 1e-6 for wide, narrow in zip(beam4, beam1, strict=True))
    assert any(list(h.tokens) != g for h, g in zip(beam4, greedy, strict=True))


@pytest.mark.parametrize("width", [1, 5])
def test_best_candidates_are_the_best_of_all_tokens_of_all_beams(width: int) -> None:
    """Ranking each beam's best tokens gives what ranking all of them gives (scores, parents,
    tokens, order), whichever beam holds a row's best."""
    generator = torch.Generator().manual_seed(width)
    batch, vocab, wanted = 3, 500, 10
    scores = torch.randn(batch, width, generator=generator) * 4
    log_probs = torch.log_softmax(torch.randn(batch * width, vocab, generator=generator) * 3, -1)
    best, best_tokens = log_probs.topk(wanted, dim=-1)  # each beam's own best, as a step gives
    top_scores, parents, tokens = best_candidates(scores, best, best_tokens, wanted)
    every = (scores.unsqueeze(-1) + log_probs.view(batch, width, vocab)).view(batch, -1)
    expected_scores, expected = every.topk(wanted, dim=-1)
    torch.testing.assert_close(top_scores, expected_scores)
    assert torch.equal(parents, expected // vocab) and torch.equal(tokens, expected % vocab)


def test_dense_select_copies_repeated_rows() -> None:
    k = torch.randn(2, 5, 2, 4)
    kv = DecoderKv([(k, k)], 4)
    kv.select(torch.tensor([1, 1, 0]))
    assert kv.batch_size == 3
    read = kv._cross[0][0].read(5, torch.float32)
    torch.testing.assert_close(read, k[[1, 1, 0]])


@pytest.mark.parametrize("kv_cache", [None, "fp8_e4m3"])
def test_a_beam_step_reorders_its_self_kv_in_place(kv_cache: str | None) -> None:
    """A select that keeps the row count (a beam step) rewrites only the rows whose parent is
    another row, in place: every row then reads its parent's tokens as they were (a parent
    that is itself replaced is read before), and the buffers are the same tensors."""
    gen = torch.Generator().manual_seed(4)
    cross = torch.randn(1, 3, 2, 4, generator=gen)
    kv = DecoderKv([(cross, cross)], 6, kv_cache, shared_cross=True)
    kv.select(torch.tensor([0, 0, 0, 0]))  # 4 beams of the one group
    q = torch.randn(4, 3, 2, 4, generator=gen)
    keys, values = torch.randn(4, 3, 2, 4, generator=gen), torch.randn(4, 3, 2, 4, generator=gen)
    kv.attend_self(0, q, keys, values)
    kv.advance(3)
    before = [buf.read(3, torch.float32).clone() for buf in kv._self[0]]
    storage = kv._self[0][0].data.data_ptr()
    index = torch.tensor([2, 0, 2, 1])  # row 0 takes row 2's, row 1 row 0's (before), ...
    kv.select(index)
    after = [buf.read(3, torch.float32) for buf in kv._self[0]]
    assert kv._self[0][0].data.data_ptr() == storage
    for old, new in zip(before, after, strict=True):
        assert torch.equal(new, old[index])


@torch.inference_mode()
@pytest.mark.parametrize("kv_cache", [None, "fp8_e4m3"])
@pytest.mark.parametrize("shared_cross", [True, False])
def test_rows_that_stop_leave_the_batch_and_the_others_decode_as_alone(
        shared_cross: bool, kv_cache: str | None) -> None:
    """A batch whose rows end at different steps: each row's hypothesis (tokens, scores, token
    log-probs) is the one it gets decoded alone, and the rows that stopped left the batch (the
    later decoder calls ran fewer rows)."""
    model = tiny_model(seed=5)
    with torch.no_grad():
        # some rows end early (fp8's rounding needs a likelier end token for that)
        model.decoder.embedding.weight[TINY_SPEC.eot] *= 5.0 if kv_cache is None else 7.0
    encoded = tiny_encoded(6, seed=33)
    widths: list[int] = []  # rows of each decoder call (its final LayerNorm sees them all)
    hook = model.decoder.norm.register_forward_hook(
        lambda _m, args, _out: widths.append(args[0].size(0)))
    try:
        batched = beam_search(model, TINY_SPEC, DecoderKv(model.decoder.cross_kv(encoded), 20,
                                                          kv_cache, shared_cross), 3, 16)
    finally:
        hook.remove()
    lengths = [len(h.tokens) for h in batched]
    assert len(set(lengths)) > 1, lengths  # the rows do stop at different steps
    assert widths[0] == 6 and widths[1] == 18 and min(widths[1:]) < 18  # rows left
    for row, got in enumerate(batched):
        cross = model.decoder.cross_kv(encoded[row : row + 1])
        (alone,) = beam_search(model, TINY_SPEC, DecoderKv(cross, 20, kv_cache, shared_cross),
                               3, 16)
        assert got.tokens == alone.tokens
        assert got.score == pytest.approx(alone.score, abs=1e-4)
        assert got.token_log_probs == pytest.approx(alone.token_log_probs, abs=1e-4)


def test_keep_groups_keeps_the_groups_cross_kv_in_place() -> None:
    k = torch.randn(4, 5, 2, 4)
    kv = DecoderKv([(k, -k)], 4, shared_cross=True)
    order = kv.keep_groups([1, 3])  # group 3 moves into the slot group 0 left
    assert order == [3, 1]
    kv.select(torch.tensor([3, 3, 1, 1]))  # two rows per kept group, in that order
    assert kv.num_groups == 2 and kv.batch_size == 4
    torch.testing.assert_close(kv._cross[0][0].read(5, torch.float32)[:2], k[[3, 1]])
    torch.testing.assert_close(kv._cross[0][1].read(5, torch.float32)[:2], -k[[3, 1]])
    assert kv.keep_groups([0]) == [0]  # nothing to move
    torch.testing.assert_close(kv._cross[0][0].read(5, torch.float32)[:1], k[[3]])
    plain = DecoderKv([(k, k)], 4)
    assert plain.keep_groups([1]) == [1]  # a per-row cross K/V: select alone decides
    assert plain._cross[0][0].read(5, torch.float32).shape[0] == 4


@pytest.mark.slow
def test_beam_five_matches_ctranslate2(checkpoint: WhisperCheckpoint, devset_encoded,
                                       devset_mel, recordings, dense_tokens) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is the reference")
    rows = rows_named(recordings, "george_0", "jfk")  # george_0: beam 5 differs from greedy
    transcriber = WhisperTranscriber(checkpoint, WhisperDecodeConfig(beam_size=5))
    assert transcriber.storage == "dense" and transcriber.manager is None
    ours = transcriber.decode_encoded(devset_encoded[rows])
    reference = ctranslate2.models.Whisper(str(checkpoint.path), device="cpu",
                                           compute_type="float32", intra_threads=1)
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(devset_mel[rows].numpy()))
    theirs = reference.generate(features, [list(checkpoint.spec.prompt)] * 2, beam_size=5)
    assert [list(t.tokens) for t in ours] == [r.sequences_ids[0] for r in theirs]
    assert list(ours[0].tokens) != dense_tokens[rows[0]]


@torch.inference_mode()
def test_a_stop_gives_the_search_up_before_its_next_decoder_call() -> None:
    from oasr.models.whisper.decoding import SearchStopped

    model = tiny_model(seed=31)
    cross = model.decoder.cross_kv(tiny_encoded(2, seed=32))
    calls = []
    hook = model.decoder.norm.register_forward_hook(lambda *_: calls.append(1))
    try:
        asked = [0]

        def stop_at_third() -> bool:
            asked[0] += 1
            return asked[0] == 3

        with pytest.raises(SearchStopped):
            beam_search(model, TINY_SPEC, DecoderKv(cross, 14), 3, 12, stop=stop_at_third)
        assert len(calls) == 2  # the prompt and one step; none after the stop
        kept = beam_search(model, TINY_SPEC, DecoderKv(cross, 14), 3, 12, stop=lambda: False)
    finally:
        hook.remove()
    assert kept == beam_search(model, TINY_SPEC, DecoderKv(cross, 14), 3, 12)



@torch.inference_mode()
def test_a_dropped_group_leaves_and_the_others_decode_as_alone() -> None:
    from oasr.models.whisper.decoding import BeamSearch

    model = tiny_model(seed=31)
    encoded = tiny_encoded(4, seed=41)
    cross = model.decoder.cross_kv(encoded)
    search = BeamSearch(model, TINY_SPEC, 3)
    search.start(DecoderKv(cross, 14, shared_cross=True), ["a", "b", "c", "d"],
                 [12, 12, 12, 5])
    assert search.drop("d")  # before its first token: one live beam per group
    found = dict(search.step())
    assert search.drop("b") and not search.drop("b") and "b" not in search.group_keys()
    with pytest.raises(ValueError, match="still searched"):
        search.start(DecoderKv(cross, 14, shared_cross=True), ["e"] * 4, [12] * 4)
    while search.num_groups:
        found.update(search.step())
    assert set(found) == {"a", "c"} and search.kv is None
    for key, row in (("a", 0), ("c", 2)):
        single = model.decoder.cross_kv(encoded[row : row + 1])
        (alone,) = beam_search(model, TINY_SPEC, DecoderKv(single, 14), 3, 12)
        assert found[key].tokens == alone.tokens
