"""Streaming behaviour: chunked == whole, batched == one by one, greedy == argmax collapse."""

import pytest
import torch

from oasr.decoding import CharTokenizer, GpuDecoderConfig, GpuStreamingDecoder, Hypothesis
from oasr.decoding.state import new_state

from .reference import greedy

VOCAB = 7


def random_log_probs(seed: int, batch: int, frames: int, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(batch, frames, vocab, generator=g)
    logits[:, :, 0] += 1.5  # blank-heavy like a real CTC model, so repeats and gaps occur
    return logits.log_softmax(-1)


def make(beam: int, **cfg: object) -> GpuStreamingDecoder:
    return GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam, **cfg), device="cpu")


def assert_same(a: list[Hypothesis], b: list[Hypothesis]) -> None:
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.timestamps for h in a] == [h.timestamps for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def whole(dec: GpuStreamingDecoder, lp: torch.Tensor) -> list[Hypothesis]:
    """Decode (T, V) in one call."""
    state = dec.create_state(1, lp.shape[-1])
    dec.decode_chunk(lp[None], state)
    return dec.finalize_stream(state)


@pytest.mark.parametrize("beam", [1, 2, 4, 10])
@pytest.mark.parametrize("seed", range(3))
def test_chunked_equals_whole(beam: int, seed: int) -> None:
    dec = make(beam, initial_token_capacity=2)  # also forces the buffers to grow mid-stream
    lp = random_log_probs(seed, 1, 40)[0]
    state = dec.create_state(1, VOCAB)
    bounds = [0, 1, 5, 16, 17, 33, 40]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        dec.decode_chunk(lp[None, lo:hi], state)
    assert_same(dec.finalize_stream(state), whole(make(beam), lp))


@pytest.mark.parametrize("beam", [1, 5])
def test_empty_chunk_changes_nothing(beam: int) -> None:
    dec = make(beam)
    lp = random_log_probs(9, 1, 12)[0]
    state = dec.create_state(1, VOCAB)
    dec.decode_chunk(lp[None, :6], state)
    dec.decode_chunk(lp[None, 6:6], state)
    dec.decode_chunk(lp[None, 6:], state)
    assert_same(dec.finalize_stream(state), whole(dec, lp))


@pytest.mark.parametrize("beam", [1, 3, 10])
def test_decode_streams_equals_one_by_one(beam: int) -> None:
    dec = make(beam, initial_token_capacity=4)
    lens = [[16, 16, 16], [16, 9, 16], [0, 16, 3], [16, 16, 16]]  # per chunk, per stream
    lp = random_log_probs(5, 3, 16 * len(lens))
    states = [dec.create_state(1, VOCAB) for _ in range(3)]
    singles = [dec.create_state(1, VOCAB) for _ in range(3)]
    consumed = [0, 0, 0]
    streams = [[] for _ in range(3)]
    for chunk_lens in lens:
        batch = torch.zeros(3, 16, VOCAB)
        for i, n in enumerate(chunk_lens):
            part = lp[i, consumed[i] : consumed[i] + n]
            batch[i, :n] = part
            batch[i, n:] = float("nan")  # padding must never be read
            streams[i].append(part)
            consumed[i] += n
            dec.decode_chunk(part[None], singles[i])
        dec.decode_streams(batch, states, torch.tensor(chunk_lens))
        for i in range(3):
            assert dec.partial(states[i]) == dec.partial(singles[i])
    for i in range(3):
        assert_same(dec.finalize_stream(states[i]), dec.finalize_stream(singles[i]))
        assert_same(dec.finalize_stream(states[i]), whole(dec, torch.cat(streams[i])))
    assert [s.stats.num_frames for s in dec.partials(states)] == consumed


@pytest.mark.parametrize("beam", [1, 4])
def test_multi_row_state_equals_one_by_one(beam: int) -> None:
    dec = make(beam)
    lp = random_log_probs(6, 4, 20)
    state = dec.create_state(4, VOCAB)
    dec.decode_chunk(lp[:, :12], state)
    dec.decode_chunk(lp[:, 12:], state)
    for row in range(4):
        assert_same(dec.finalize_stream(state, row), whole(dec, lp[row]))
    assert dec.partials([state], row=2)[0].hypothesis == dec.finalize_stream(state, 2)[0]
    assert dec.partial(state, row=2) == dec.finalize_stream(state, 2)[0]
    with pytest.raises(IndexError, match="row 4 out of range for a state of 4 rows"):
        dec.partial(state, row=4)


def test_greedy_equals_argmax_collapse() -> None:
    dec = make(1)
    for seed in range(5):
        lp = random_log_probs(20 + seed, 1, 50)[0]
        tokens, frames = greedy(lp.tolist(), blank=0)
        state = dec.create_state(1, VOCAB)
        for lo in range(0, 50, 7):  # chunk boundaries cut through repeats
            dec.decode_chunk(lp[None, lo : lo + 7], state)
        (hyp,) = dec.finalize_stream(state)
        assert tuple(hyp.tokens) == tokens and tuple(hyp.timestamps) == frames
        assert hyp.score == pytest.approx(lp.max(-1).values.sum().item(), abs=1e-4)


def test_greedy_repeat_across_chunk_boundary_is_collapsed() -> None:
    dec = make(1)
    lp = torch.full((1, 4, 3), -9.0)
    lp[0, [0, 1, 2, 3], [2, 2, 0, 2]] = 0.0  # a a _ a -> "a a" (two tokens)
    state = dec.create_state(1, 3)
    dec.decode_chunk(lp[:, :1], state)
    dec.decode_chunk(lp[:, 1:], state)
    assert dec.partial(state).tokens == [2, 2]
    assert dec.partial(state).timestamps == [0, 3]


def test_partial_is_the_best_final_hypothesis_and_has_text() -> None:
    units = ["<blank>", "<unk>", "a", "b", "c", "\u2581", "<sos/eos>"]
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=4), CharTokenizer.from_units(units), "cpu")
    lp = random_log_probs(2, 1, 30)
    state = dec.create_state(1, VOCAB)
    dec.decode_chunk(lp[:, :10], state)
    hyp = dec.partial(state)
    assert hyp == dec.finalize_stream(state)[0]
    dec.decode_chunk(lp[:, 10:], state)
    best = dec.finalize_stream(state)
    assert dec.partial(state) == best[0]
    assert best[0].text == dec.tokenizer.decode(best[0].tokens)
    assert best[0].text and "<" not in best[0].text


@pytest.mark.parametrize("beam", [1, 3])
def test_reset_state_reuses_and_rewinds(beam: int) -> None:
    dec = make(beam)
    lp = random_log_probs(8, 1, 24)
    state = dec.create_state(1, VOCAB)
    dec.decode_chunk(lp[:, :16], state)
    buffer = state.tokens
    dec.reset_state(state, 1, VOCAB)
    assert state.tokens is buffer
    assert dec.finalize_stream(state) == [Hypothesis([], "", 0.0, [])]
    dec.decode_chunk(lp[:, 16:], state)
    assert_same(dec.finalize_stream(state), whole(dec, lp[0, 16:]))
    assert dec.partials([state])[0].stats.num_frames == 8
    dec.reset_state(state, 2, VOCAB)
    assert state.batch_size == 2


def test_reset_after_decode_streams_leaves_other_streams_alone() -> None:
    dec = make(3)
    lp = random_log_probs(4, 2, 10)
    states = [dec.create_state(1, VOCAB) for _ in range(2)]
    dec.decode_streams(lp, states)
    before = dec.finalize_stream(states[1])
    dec.reset_state(states[0], 1, VOCAB)
    assert dec.finalize_stream(states[1]) == before
    assert dec.finalize_stream(states[0]) == [Hypothesis([], "", 0.0, [])]


def test_input_errors() -> None:
    dec = make(2)
    state = dec.create_state(2, VOCAB)
    with pytest.raises(ValueError, match=r"log_probs has 1 rows but the state holds 2"):
        dec.decode_chunk(torch.zeros(1, 3, VOCAB), state)
    with pytest.raises(ValueError, match=r"must be \(B, T, V\)"):
        dec.decode_chunk(torch.zeros(3, VOCAB), state)
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        dec.decode_chunk(torch.zeros(2, 3, VOCAB), state, torch.tensor([3]))
    with pytest.raises(ValueError, match="blank_id 9 is outside a vocabulary of 7"):
        GpuStreamingDecoder(GpuDecoderConfig(blank_id=9), device="cpu").create_state(1, VOCAB)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beam_size": 0}, "beam_size must be >= 1"),
        ({"beam_size": 2, "nbest": 3}, "nbest must be in 1..beam_size=2"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"min_token_log_prob": 1.0}, "must be <= 0"),
        ({"blank_penalty": -1.0}, "blank_penalty must be >= 0"),
        ({"blank_id": -1}, "blank_id must be >= 0"),
        ({"initial_token_capacity": 0}, "initial_token_capacity must be >= 1"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GpuDecoderConfig(**kwargs)


def test_blank_penalty_emits_more() -> None:
    lp = random_log_probs(12, 1, 40)[0]
    plain = whole(make(1), lp)[0]
    penalised = whole(make(1, blank_penalty=3.0), lp)[0]
    assert len(penalised.tokens) > len(plain.tokens)
    shifted = lp.clone()
    shifted[:, 0] -= 3.0
    assert penalised.tokens == list(greedy(shifted.tolist(), blank=0)[0])


@pytest.mark.parametrize("beam", [1, 3])
def test_partials_of_states_with_different_capacities(beam: int) -> None:
    dec = make(beam, initial_token_capacity=2)
    lp = random_log_probs(13, 3, 30)
    # states with tensors of their own (the decoder's batch-1 states share one capacity)
    states = [new_state(1, beam, 2, 0, torch.device("cpu")) for _ in range(3)]
    for i, n in enumerate([30, 4, 0]):  # capacities grow differently
        dec.decode_chunk(lp[i : i + 1, :n], states[i])
    assert len({s.capacity for s in states}) == 3
    together = dec.partials(states)
    assert [t.hypothesis for t in together] == [dec.finalize_stream(s)[0] for s in states]
    assert together[2].hypothesis == Hypothesis([], "", 0.0, [])
    assert [t.stats.num_frames for t in together] == [30, 4, 0]


@pytest.mark.parametrize("beam", [1, 3])
def test_finalize_is_never_empty(beam: int) -> None:
    dec = make(beam)
    state = dec.create_state(1, VOCAB)
    dec.decode_chunk(torch.full((1, 3, VOCAB), float("-inf")), state)
    (hyp,) = dec.finalize_stream(state)
    assert hyp.score == float("-inf")


def test_lengths_out_of_range_are_refused() -> None:
    dec = make(3)
    state = dec.create_state(2, VOCAB)
    with pytest.raises(ValueError, match=r"lengths must be in 0..4, got \[5, 1\]"):
        dec.decode_chunk(torch.zeros(2, 4, VOCAB), state, torch.tensor([5, 1]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("beam", [1, 10])
def test_cuda_equals_cpu(beam: int) -> None:
    lp = random_log_probs(30, 4, 48)
    lengths = torch.tensor([16, 7, 0, 16])
    results = {}
    for device in ("cpu", "cuda"):
        dec = GpuStreamingDecoder(
            GpuDecoderConfig(beam_size=beam, initial_token_capacity=4), device=device
        )
        states = [dec.create_state(1, VOCAB) for _ in range(4)]
        for lo in range(0, 48, 16):
            dec.decode_streams(lp[:, lo : lo + 16].to(device), states, lengths)
        results[device] = [dec.finalize_stream(s) for s in states]
    for got, want in zip(results["cuda"], results["cpu"], strict=True):
        assert_same(got, want)
