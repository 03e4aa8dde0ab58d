"""Continuous batching of second-pass requests == each request decoded alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ct2_writer import write_tiny_tokenizer
from whisper_devset import dense_search, rows_named
from whisper_testutil import TINY, TINY_SPEC, tiny_encoded, tiny_model

from oasr.models.whisper import DecoderKv, WhisperCheckpoint, WhisperTokenizer, greedy_decode
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.safeguards import FallbackRule
from oasr.models.whisper.transcriber import WhisperDecodeConfig, without_safeguards
from oasr.models.whisper.window import EncoderWindow, SegmentEncoder


def tiny_checkpoint(tmp_path: Path, seed: int) -> WhisperCheckpoint:
    write_tiny_tokenizer(tmp_path / "tokenizer.json", TINY.n_vocab)
    model = tiny_model(seed)
    with torch.no_grad():  # make the end token likely enough that rows finish at different steps
        model.decoder.embedding.weight[TINY_SPEC.eot] *= 3.0
    return WhisperCheckpoint(model, WhisperTokenizer(tmp_path), TINY_SPEC, tmp_path)


def alone(checkpoint: WhisperCheckpoint, encoded: torch.Tensor, limit: int) -> list[int]:
    model = checkpoint.model
    with torch.inference_mode():
        kv = DecoderKv(model.decoder.cross_kv(encoded[None]), len(TINY_SPEC.prompt) + limit)
        return greedy_decode(model, TINY_SPEC, kv, 1, limit)[0]


def test_staggered_requests_decode_as_if_alone(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=21)
    encoded = tiny_encoded(6, seed=22)
    config = without_safeguards(WhisperDecodeConfig(max_rows=3, max_new_tokens=12, block_size=4))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    pool = decoder.manager.pool
    expected = {i: alone(checkpoint, encoded[i], 12) for i in range(6)}
    assert len({len(t) for t in expected.values()}) > 1, "rows should finish at different steps"

    arrivals = {0: [0, 1], 2: [2, 3, 4], 5: [5]}  # step -> requests submitted before it
    results, max_running = {}, 0
    for step in range(80):
        for request in arrivals.get(step, []):
            decoder.submit_encoded(request, encoded[request])
        for result in decoder.step():
            results[result.request_id] = result
        max_running = max(max_running, decoder.num_running)
        if not decoder.has_work() and step > 5:
            break
    assert max_running == 3  # the row cap held requests back
    assert {i: list(r.tokens) for i, r in results.items()} == expected
    assert results[1].text == " ".join(f"w{t}" for t in expected[1])
    assert pool.num_free_blocks == pool.num_blocks and decoder.manager.num_reserved_blocks == 0


def test_pool_budget_holds_requests_back_and_abort_frees(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=23)
    encoded = tiny_encoded(3, seed=24)
    # one row = ceil(14 / 4) + ceil(20 / 4) = 9 pages; 20 pages admit two rows, not three
    config = without_safeguards(
        WhisperDecodeConfig(max_rows=3, max_new_tokens=12, block_size=4, max_num_blocks=20))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    for request in range(3):
        decoder.submit_encoded(request, encoded[request])
    decoder.step()
    assert (decoder.num_running, decoder.num_waiting) == (2, 1)
    assert decoder.abort(0) and not decoder.abort(99)
    assert decoder.manager.num_rows == 1
    decoder.step()  # request 2 is admitted into the freed reservation
    assert decoder.num_waiting == 0 and decoder.manager.num_rows <= 2
    while decoder.has_work():
        decoder.step()
    assert decoder.manager.pool.num_free_blocks == 20


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "fit"])
def test_real_requests_match_dense_tokens(checkpoint: WhisperCheckpoint, recordings,
                                          mode: str) -> None:
    window = EncoderWindow(mode)
    config = without_safeguards(WhisperDecodeConfig(max_rows=2, encoder_window=window))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    picks = rows_named(recordings, "jfk", "george_0", "jackson_1")  # three lengths, two rows
    encoded = SegmentEncoder(checkpoint.model, window)([recordings[i].waveform for i in picks])
    expected = dict(zip(picks, dense_search(checkpoint, encoded), strict=True))
    for i in picks[:2]:
        decoder.submit(i, recordings[i].waveform)
    results = {}
    for step in range(200):
        if step == 3:
            decoder.submit(picks[2], recordings[picks[2]].waveform)
        results.update({r.request_id: r for r in decoder.step()})
        if not decoder.has_work():
            break
    assert {i: list(r.tokens) for i, r in results.items()} == {
        i: list(h.tokens) for i, h in expected.items()}
    for i in picks:
        assert results[i].avg_log_prob == pytest.approx(expected[i].avg_log_prob, abs=1e-4)
        assert results[i].no_speech_prob == pytest.approx(expected[i].no_speech_prob, abs=1e-5)
    assert decoder.manager.pool.num_free_blocks == decoder.manager.pool.num_blocks


def test_a_failed_prefill_frees_its_rows_and_the_decoder_goes_on(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=25)
    config = without_safeguards(WhisperDecodeConfig(max_rows=2, max_new_tokens=6, block_size=4))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    pool = decoder.manager.pool
    too_long = torch.randn(TINY.n_audio_ctx + 4, TINY.n_audio_state)  # 24 frames > 20 reserved
    decoder.submit_encoded(0, too_long)
    with pytest.raises(ValueError, match="cross K/V has 24 frames, rows reserve 20"):
        decoder.step()
    assert pool.num_free_blocks == pool.num_blocks and decoder.manager.num_rows == 0
    assert decoder.num_running == 0 and not decoder.has_work()
    good = tiny_encoded(1, seed=26)[0]
    decoder.submit_encoded(1, good)
    results = []
    while decoder.has_work():
        results += decoder.step()
    assert [list(r.tokens) for r in results] == [alone(checkpoint, good, 6)]
    assert pool.num_free_blocks == pool.num_blocks


def test_submit_refuses_waveforms_whisper_cannot_take(tmp_path: Path) -> None:
    decoder = ContinuousWhisperDecoder(
        tiny_checkpoint(tmp_path, seed=27),
        without_safeguards(WhisperDecodeConfig(max_rows=1, max_new_tokens=4)))
    with pytest.raises(ValueError, match=r"request 3: waveform of shape \(480001,\)"):
        decoder.submit(3, torch.zeros(480001))
    with pytest.raises(ValueError, match=r"shape \(2, 100\)"):
        decoder.submit(4, torch.zeros(2, 100))
    assert decoder.num_waiting == 0


def _always_predict(checkpoint: WhisperCheckpoint, token: int):  # type: ignore[no-untyped-def]
    """Make every decoder step all but certain of ``token`` (a decoder stuck in a loop)."""
    bias = torch.zeros(TINY.n_vocab)
    bias[token] = 40.0
    return checkpoint.model.decoder.register_forward_hook(lambda module, args, out: out + bias)


def test_a_looping_request_stops_early_falls_back_and_is_flagged(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=28)
    config = WhisperDecodeConfig(max_rows=10, block_size=4)
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    hook = _always_predict(checkpoint, token=5)
    try:
        for request in range(2):
            decoder.submit_encoded(request, tiny_encoded(2, seed=29)[request])
        results, max_running = [], 0
        for _ in range(400):
            results += decoder.step()
            max_running = max(max_running, decoder.num_running)
            if not decoder.has_work():
                break
    finally:
        hook.remove()
    temperatures = config.fallback.temperatures
    assert sorted(r.request_id for r in results) == [0, 1]
    for result in results:
        assert result.failed and result.num_decodes == len(temperatures)
        # stopped by the repetition rule at 12 copies, far below the 30-token window
        assert result.looped and result.tokens == (5,) * 12
    assert decoder.num_fallbacks == 2 and decoder.num_loops > 0
    # the ladder runs at once: five temperatures x two samples (10 rows / 5) in one batch
    assert decoder.samples_per_temperature == 2 and max_running == 10
    pool = decoder.manager.pool
    assert pool.num_free_blocks == pool.num_blocks and decoder.manager.num_rows == 0


def test_token_budget_cuts_a_row_that_never_ends(tmp_path: Path) -> None:
    from oasr.models.whisper.safeguards import FallbackRule, TokenBudget

    checkpoint = tiny_checkpoint(tmp_path, seed=30)
    config = WhisperDecodeConfig(max_rows=2, block_size=4, repetition=None,
                                 token_budget=TokenBudget(per_second=1.0, base=3),
                                 fallback=FallbackRule(temperatures=(0.0,)))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    hook = _always_predict(checkpoint, token=7)
    try:
        decoder.submit_encoded(0, tiny_encoded(1, seed=31)[0], num_samples=2 * 16000)  # 3 + 2
        results = []
        while decoder.has_work():
            results += decoder.step()
    finally:
        hook.remove()
    (result,) = results
    assert result.tokens == (7,) * 5 and result.failed and result.num_decodes == 1
    assert decoder.manager.pool.num_free_blocks == decoder.manager.pool.num_blocks


def _beam_config(beam_size: int = 3) -> WhisperDecodeConfig:
    from oasr.models.whisper.safeguards import FallbackRule

    return WhisperDecodeConfig(max_rows=4, max_new_tokens=12, block_size=4, beam_size=beam_size,
                               token_budget=None, repetition=None,
                               fallback=FallbackRule(temperatures=(0.0,)))


def _beam_alone(checkpoint, states: torch.Tensor, beam_size: int = 3):  # type: ignore[no-untyped-def]
    from oasr.models.whisper import beam_search

    model = checkpoint.model
    with torch.inference_mode():
        kv = DecoderKv(model.decoder.cross_kv(states[None]), len(TINY_SPEC.prompt) + 12)
        (hyp,) = beam_search(model, TINY_SPEC, kv, beam_size, 12)
    return hyp


def test_beam_first_decodes_equal_beam_search_alone(tmp_path: Path) -> None:
    # alone these take 12, 12 and 5 tokens: the short one leaves the search first
    checkpoint = tiny_checkpoint(tmp_path, seed=35)
    encoded = tiny_encoded(3, seed=39)
    decoder = ContinuousWhisperDecoder(checkpoint, _beam_config())
    for request in range(3):
        decoder.submit_encoded(request, encoded[request])
    results = decoder.step()  # the three first decodes, one batched beam search
    assert sorted(r.request_id for r in results) == [0, 1, 2] and not decoder.has_work()
    for result in results:
        alone = _beam_alone(checkpoint, encoded[result.request_id])
        assert result.tokens == alone.tokens
        assert result.avg_log_prob == pytest.approx(
            alone.log_prob / (len(alone.tokens) + 1), abs=1e-5)


def test_the_segment_cap_holds_later_requests_for_the_next_search(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=32)
    encoded = tiny_encoded(6, seed=34)
    decoder = ContinuousWhisperDecoder(checkpoint, _beam_config())  # max_rows 4
    for request in range(6):
        decoder.submit_encoded(request, encoded[request])
    first = decoder.step()
    assert sorted(r.request_id for r in first) == [0, 1, 2, 3] and decoder.num_waiting == 2
    second = decoder.step()
    assert sorted(r.request_id for r in second) == [4, 5] and not decoder.has_work()
    for result in first + second:
        assert result.tokens == _beam_alone(checkpoint, encoded[result.request_id]).tokens


def test_a_fallback_samples_the_same_text_whatever_shares_its_batch(tmp_path: Path) -> None:
    # the decoder's logits made flat but for a favourite token (greedy loops on it and fails)
    # and a likely end token: the fallback's samples are random short texts that pass, and
    # the likeliest is kept. Request 7 decoded alone, after other requests and beside them
    # keeps the same sample (its rows' generators are seeded from its input, not shared)
    checkpoint = tiny_checkpoint(tmp_path, seed=41)
    bias = torch.zeros(TINY.n_vocab)
    bias[5], bias[TINY_SPEC.eot] = 3.0, 2.9
    hook = checkpoint.model.decoder.register_forward_hook(
        lambda module, args, out: torch.zeros_like(out) + bias)
    rule = FallbackRule(temperatures=(0.0, 1.0), log_prob_threshold=float("-inf"))
    config = WhisperDecodeConfig(max_rows=10, block_size=4, fallback=rule)
    target, other = tiny_encoded(2, seed=42)

    def decode(companions: list[torch.Tensor], seed: int = 0) -> tuple[int, ...]:
        decoder = ContinuousWhisperDecoder(checkpoint, config, seed=seed)
        for i, states in enumerate(companions):
            decoder.submit_encoded(100 + i, states)
        decoder.submit_encoded(7, target)
        results = []
        for _ in range(400):
            results += decoder.step()
            if not decoder.has_work():
                break
        (mine,) = [r for r in results if r.request_id == 7]
        assert mine.temperature == 1.0 and not mine.failed  # a sample was kept
        return mine.tokens

    try:
        alone = decode([])
        assert decode([other]) == alone
        assert decode([other, other * 2]) == alone
        # the draws are random: other decoder seeds sample other texts
        assert {decode([], seed=s) for s in range(1, 4)} != {alone}
    finally:
        hook.remove()


def test_an_aborted_request_leaves_the_beam_search_and_the_others_go_on(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=36)
    encoded = tiny_encoded(3, seed=34)  # alone: 12, 12 and 3 tokens
    decoder = ContinuousWhisperDecoder(checkpoint, _beam_config())
    asked: list[int] = []
    aborted: set[int] = set()

    def cancelled(request_id: int) -> bool:
        asked.append(request_id)
        if len(asked) == 7:  # told by the loop while the search runs (its second token)
            aborted.update({0, 2})
        return request_id in aborted

    decoder.cancelled = cancelled
    for request in range(3):
        decoder.submit_encoded(request, encoded[request])
    results = decoder.step()
    assert [r.request_id for r in results] == [1] and decoder.num_cancelled == 2
    assert results[0].tokens == _beam_alone(checkpoint, encoded[1]).tokens
    assert asked.count(1) > 6 and asked.count(0) == asked.count(2) == 3  # asked every token
    assert decoder._search.kv is None and not decoder.has_work()

    # all of a batch aborted before it was encoded: nothing decoded, nothing answered
    decoder.cancelled = lambda request_id: True
    decoder.submit_encoded(5, encoded[0])
    assert decoder.step() == [] and decoder.num_cancelled == 3 and not decoder.has_work()


def test_a_beam_search_that_fails_leaves_nothing_behind(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=36)
    encoded = tiny_encoded(2, seed=34)
    decoder = ContinuousWhisperDecoder(checkpoint, _beam_config())
    search_step = decoder._search.step
    calls = [0]

    def failing_step():  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("out of memory")
        return search_step()

    monkeypatch.setattr(decoder._search, "step", failing_step)
    decoder.submit_encoded(0, encoded[0])
    with pytest.raises(RuntimeError, match="out of memory"):
        decoder.step()
    assert decoder._search.num_groups == 0 and decoder._search.kv is None
    assert not decoder.has_work()
    decoder.submit_encoded(1, encoded[1])  # the next search starts afresh
    (result,) = decoder.step()
    assert result.tokens == _beam_alone(checkpoint, encoded[1]).tokens


def test_a_greedy_result_carries_each_generated_tokens_log_probability(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=29)
    config = without_safeguards(WhisperDecodeConfig(max_rows=2, max_new_tokens=10, block_size=4))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    for request, states in enumerate(tiny_encoded(2, seed=30)):
        decoder.submit_encoded(request, states)
    results = []
    while decoder.has_work():
        results += decoder.step()
    assert len(results) == 2
    for result in results:
        lps = result.token_log_probs
        assert len(lps) == len(result.tokens) > 0 and all(lp <= 0 for lp in lps)
        # the average counts the end token too: what the tokens leave of it is its own
        end_lp = result.avg_log_prob * (len(lps) + 1) - sum(lps)
        assert end_lp <= 1e-5


def test_a_greedy_draft_gives_the_tokens_decoded_one_by_one_in_fewer_steps(tmp_path: Path) -> None:
    # a refinement's draft (the newest one's tentative words) is fed with the prompt: greedy
    # takes it where each token is its own choice, so the tokens are those it decodes alone,
    # whether the draft is right, wrong from its third token, or longer than the decode
    checkpoint = tiny_checkpoint(tmp_path, seed=23)
    encoded = tiny_encoded(3, seed=24)
    config = without_safeguards(WhisperDecodeConfig(max_rows=3, max_new_tokens=12, block_size=4))
    expected = [alone(checkpoint, encoded[i], 12) for i in range(3)]
    assert [len(e) for e in expected] == [5, 4, 12]  # two end, one runs to the cap
    vocab = TINY.n_vocab
    drafts = [tuple(expected[0]),
              tuple(expected[1][:2]) + ((expected[1][2] + 1) % vocab,) + tuple(expected[1][3:]),
              tuple(expected[2]) + (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)]
    for with_drafts in (False, True):
        decoder = ContinuousWhisperDecoder(checkpoint, config)
        for i in range(3):
            decoder.submit_encoded(i, encoded[i], draft=drafts[i] if with_drafts else ())
        results, steps = {}, 0
        while decoder.has_work():
            steps += 1
            results.update({r.request_id: list(r.tokens) for r in decoder.step()})
        assert [results[i] for i in range(3)] == expected
        assert decoder.manager.pool.num_free_blocks == decoder.manager.pool.num_blocks
        if with_drafts:  # the first and third in the prompt's step; the second from its third
            assert steps <= len(expected[1]) - 2 + 1
        else:
            assert steps == max(len(e) for e in expected) + (max(len(e) for e in expected) < 12)


def test_accepted_draft_counts_each_rows_run_of_its_own_first_choices() -> None:
    from oasr.models.whisper.decoding import accepted_draft

    vocab = 6
    logits = torch.full((2, 4, vocab), -5.0)
    for row, picks in enumerate(([1, 2, 3, 4], [1, 2, 5, 4])):
        for position, token in enumerate(picks):
            logits[row, position, token] = 5.0  # the first choice at each position
    none = torch.zeros(vocab)
    guess = torch.tensor([[1, 2, 3], [1, 2, 3]])
    both = [[1, 2, 3], [1, 2, 3]]
    runs, log_probs = accepted_draft(logits, guess, both, none, none)
    assert runs.tolist() == [3, 2] and log_probs.shape == (2, 3)
    assert log_probs[0].exp().min() > 0.99
    short = torch.tensor([[1, 2, 3], [1, 0, 0]])  # the second row's draft: one token, padded
    assert accepted_draft(logits, short, [[1, 2, 3], [1]], none, none)[0].tolist() == [3, 1]
    first = none.clone()
    first[1] = float("-inf")  # a token the first step may not take is never taken there
    assert accepted_draft(logits, guess, both, first, none)[0].tolist() == [0, 0]


def test_drafts_fit_the_smallest_budget_of_the_rows_prefilled_together(tmp_path: Path) -> None:
    # rows of one prefill hold every row's padded draft: a long draft beside a short
    # segment's row (budget 4 tokens) is cut to fit it, and both decode as they would alone
    from dataclasses import replace

    from oasr.models.whisper.safeguards import TokenBudget

    checkpoint = tiny_checkpoint(tmp_path, seed=23)
    encoded = tiny_encoded(3, seed=24)
    config = replace(without_safeguards(WhisperDecodeConfig(max_rows=3, max_new_tokens=12,
                                                            block_size=4)),
                     token_budget=TokenBudget(per_second=1.0, base=3))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    rate = 16_000
    full = alone(checkpoint, encoded[2], 12)
    decoder.submit_encoded(0, encoded[0], num_samples=rate)  # 1 s: 3 + 1 = 4 tokens
    decoder.submit_encoded(2, encoded[2], num_samples=8 * rate, draft=tuple(full))  # 11
    results = {}
    while decoder.has_work():
        results.update({r.request_id: list(r.tokens) for r in decoder.step()})
    assert results == {0: alone(checkpoint, encoded[0], 12)[:4], 2: full[:11]}
    assert decoder.manager.pool.num_free_blocks == decoder.manager.pool.num_blocks


def _greedy_after(checkpoint: WhisperCheckpoint, encoded: torch.Tensor, prompt: list[int],
                  limit: int) -> list[int]:
    """Greedy decode of one row whose decoder prompt is ``prompt`` (no forced text after the
    start tokens: the first step may not end the transcript)."""
    from oasr.models.whisper.decoding import suppression_masks

    model, spec = checkpoint.model, checkpoint.spec
    always, first = suppression_masks(spec, model.config.n_vocab, model.device)
    with torch.inference_mode():
        kv = DecoderKv(model.decoder.cross_kv(encoded[None]), len(prompt) + limit)
        logits = model.decoder(torch.tensor([prompt]), kv)[:, -1] + first
        tokens: list[int] = []
        for _ in range(limit):
            token = int(logits.argmax(dim=-1))
            if token == spec.eot:
                break
            tokens.append(token)
            logits = model.decoder(torch.tensor([[token]]), kv)[:, -1] + always
    return tokens


def test_a_previous_text_prompt_comes_before_the_start_tokens(tmp_path: Path) -> None:
    import dataclasses

    checkpoint = tiny_checkpoint(tmp_path, seed=31)
    spec = dataclasses.replace(TINY_SPEC, previous=59)  # the tiny vocabulary's <|startofprev|>
    checkpoint = WhisperCheckpoint(checkpoint.model, checkpoint.tokenizer, spec, tmp_path)
    encoded = tiny_encoded(3, seed=32)
    config = without_safeguards(WhisperDecodeConfig(max_rows=4, max_new_tokens=12, block_size=4))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    prompts = {0: (), 1: (5, 6, 7), 2: (8,)}  # prompts of other lengths decode apart
    for i, previous in prompts.items():
        decoder.submit_encoded(i, encoded[i], previous=previous)
    results = {}
    while decoder.has_work():
        results.update({r.request_id: r for r in decoder.step()})
    for i, previous in prompts.items():
        before = [59, *previous] if previous else []
        room = 12 - len(before)
        expected = _greedy_after(checkpoint, encoded[i], [*before, *spec.prompt], room)
        assert list(results[i].tokens) == expected[:room]  # the prompt is not in the result
    pool = decoder.manager.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_no_previous_text_prompt_without_the_token(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path, seed=31)  # TINY_SPEC: no <|startofprev|>
    encoded = tiny_encoded(1, seed=32)
    config = without_safeguards(WhisperDecodeConfig(max_rows=2, max_new_tokens=12, block_size=4))
    decoder = ContinuousWhisperDecoder(checkpoint, config)
    decoder.submit_encoded(0, encoded[0], previous=(5, 6, 7))
    results = []
    while decoder.has_work():
        results += decoder.step()
    assert list(results[0].tokens) == alone(checkpoint, encoded[0], 12)


def test_a_fast_final_that_fails_is_beam_searched_before_the_ladder(
        checkpoint: WhisperCheckpoint, recordings) -> None:
    """A busy server's greedy final (``fast``) that fails the fallback rule is decoded again
    by the beam search, its window encoded again, before any sampled temperature; one that
    passes is not, and neither is a refinement (``background``)."""
    from oasr.models.whisper.safeguards import FallbackRule

    (jfk,) = rows_named(recordings, "jfk")
    wave = recordings[jfk].waveform
    failing = FallbackRule(temperatures=(0.0, 1.0), log_prob_threshold=0.0, best_of=1)
    decoder = ContinuousWhisperDecoder(checkpoint, WhisperDecodeConfig(
        max_rows=4, beam_size=2, fallback=failing))
    decoder.submit(0, wave, fast=True)
    decoder.submit(1, wave, background=True)
    results = {}
    while decoder.has_work():
        results.update({r.request_id: r for r in decoder.step()})
    # greedy, then the beam search, then the one sampled temperature; all of them failed
    assert results[0].num_decodes == 3 and results[0].failed
    assert results[1].num_decodes == 1  # a refinement is never decoded again
    assert decoder.num_beam_retries == 1 and decoder.num_fallbacks == 1

    passing = ContinuousWhisperDecoder(checkpoint, WhisperDecodeConfig(max_rows=8, beam_size=2))
    passing.submit(0, wave, fast=True)
    (result,) = [r for _ in range(300) if passing.has_work() for r in passing.step()]
    assert result.num_decodes == 1 and not result.failed and "country" in result.text
    assert passing.num_beam_retries == 0
    for d in (decoder, passing):
        assert d.manager.pool.num_free_blocks == d.manager.pool.num_blocks
