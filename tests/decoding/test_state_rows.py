"""Batch-1 states as rows of one persistent storage: same results as states that own their
tensors, no per-step restacking, rows addressed by the caller and freed explicitly."""

import pytest
import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.decoding.state import TENSOR_FIELDS, new_state

from .test_streaming import VOCAB, assert_same, random_log_probs, whole

CHUNK = 16


def make(beam: int) -> GpuStreamingDecoder:
    # capacity 4 forces the storage's token buffers to grow several times during the run
    return GpuStreamingDecoder(
        GpuDecoderConfig(beam_size=beam, initial_token_capacity=4), device="cpu"
    )


def own_state(beam: int):
    """A batch-1 state with tensors of its own: decoded through the stack / split path."""
    return new_state(1, beam, 4, 0, torch.device("cpu"))


@pytest.mark.parametrize("beam", [1, 4])
def test_long_run_with_joins_resets_and_leaves_equals_own_states_and_offline(beam: int) -> None:
    """30 steps of a changing cohort (12 streams: more than the storage's first 8 rows)."""
    dec = make(beam)
    num_streams, steps = 12, 30
    lp = random_log_probs(21, num_streams, CHUNK * steps)
    pooled = {i: dec.create_state(1, VOCAB) for i in range(num_streams)}
    owned = {i: own_state(beam) for i in range(num_streams)}
    since_reset = {i: 0 for i in range(num_streams)}
    gen = torch.Generator().manual_seed(3)
    for step in range(steps):
        cohort = [i for i in range(num_streams) if (i + step) % 5 != 0]  # streams sit out
        lengths = torch.randint(0, CHUNK + 1, (len(cohort),), generator=gen)
        lengths[0] = CHUNK
        batch = torch.full((len(cohort), CHUNK, VOCAB), float("nan"))  # padding never read
        for row, (i, n) in enumerate(zip(cohort, lengths.tolist(), strict=True)):
            batch[row, :n] = lp[i, step * CHUNK : step * CHUNK + n]
        dec.decode_streams(batch, [pooled[i] for i in cohort], lengths)
        dec.decode_streams(batch, [owned[i] for i in cohort], lengths)
        # hypotheses and frame stats alike
        assert dec.partials([pooled[i] for i in cohort]) == \
            dec.partials([owned[i] for i in cohort])
        for i in cohort:
            since_reset[i] += 1
        if step % 7 == 6:  # an endpoint: reset one stream in place
            victim = cohort[step % len(cohort)]
            dec.reset_state(pooled[victim], 1, VOCAB)
            dec.reset_state(owned[victim], 1, VOCAB)
    for i in range(num_streams):
        assert_same(dec.finalize_stream(pooled[i]), dec.finalize_stream(owned[i]))
    # a stream never reset and never short equals the offline decode of all its frames
    solo = dec.create_state(1, VOCAB)
    for step in range(steps):
        dec.decode_chunk(lp[:1, step * CHUNK : (step + 1) * CHUNK], solo)
    assert_same(dec.finalize_stream(solo), whole(make(beam), lp[0]))


@pytest.mark.parametrize("beam", [1, 3])
def test_states_are_views_of_one_storage_that_steady_steps_keep(beam: int) -> None:
    dec = GpuStreamingDecoder(
        GpuDecoderConfig(beam_size=beam, initial_token_capacity=128), device="cpu"
    )
    states = [dec.create_state(1, VOCAB) for _ in range(5)]
    storage = dec._rows.storage
    for state in states:
        row = state.pool_row
        assert row is not None
        for name in TENSOR_FIELDS:
            assert getattr(state, name).data_ptr() == getattr(storage, name)[row].data_ptr()
    lp = random_log_probs(2, 5, CHUNK * 6)
    pointers = {n: getattr(storage, n).data_ptr() for n in TENSOR_FIELDS}
    for step in range(3):  # 48 frames: never more than 128 - 17 tokens, so no growth
        dec.decode_streams(lp[:, step * CHUNK : (step + 1) * CHUNK], states)
        dec.partials(states)
        assert {n: getattr(dec._rows.storage, n).data_ptr() for n in TENSOR_FIELDS} == pointers
    # decoding through one state's handle writes the same storage row
    dec.decode_chunk(lp[2:3, 3 * CHUNK : 4 * CHUNK], states[2])
    assert states[2].num_frames.data_ptr() == dec._rows.storage.num_frames[2].data_ptr()
    assert dec.partials(states)[2].stats.num_frames == 4 * CHUNK


def test_rows_are_reused_after_an_explicit_free_and_detached_on_a_batch_change() -> None:
    dec = make(1)
    a, b = dec.create_state(1, VOCAB), dec.create_state(1, VOCAB)
    assert (a.pool_row, b.pool_row) == (0, 1)
    dec.decode_chunk(random_log_probs(1, 1, 8), a)
    kept = dec.finalize_stream(a)
    dec.free_state(b)
    c = dec.create_state(1, VOCAB)
    assert c.pool_row == 1 and dec._rows.num_attached == 2
    assert dec.finalize_stream(c)[0].tokens == []  # a reused row starts at reset
    dec.reset_state(a, 2, VOCAB)  # now a 2-row state with tensors of its own
    assert a.pool_row is None and a.batch_size == 2 and dec._rows.num_attached == 1
    d = dec.create_state(1, VOCAB)
    assert d.pool_row == 0
    dec.decode_chunk(random_log_probs(1, 1, 8), d)
    assert dec.finalize_stream(d) == kept  # a's old row, decoded from reset again
    assert dec.finalize_stream(a, 1)[0].tokens == []
    dec.free_state(a)  # owns its tensors: nothing to give back


def test_a_row_past_the_storage_grows_it_and_keeps_the_other_rows() -> None:
    dec = make(3)
    low = dec.create_state(1, VOCAB, row=2)
    lp = random_log_probs(5, 1, CHUNK)
    dec.decode_chunk(lp, low)
    before = dec.finalize_stream(low)
    high = dec.create_state(1, VOCAB, row=20)  # the engine's slot 20: past the 8 first rows
    assert dec._rows.num_rows >= 21 and high.pool_row == 20
    assert dec.finalize_stream(low) == before  # re-pointed at the grown storage
    assert low.log_pb.data_ptr() == dec._rows.storage.log_pb[2].data_ptr()
    with pytest.raises(ValueError, match="decoder row must be an int >= 0"):
        dec.create_state(1, VOCAB, row=-1)


def test_a_state_twice_in_one_call_or_no_state_is_refused() -> None:
    dec = make(1)
    state, other = dec.create_state(1, VOCAB), dec.create_state(1, VOCAB)
    with pytest.raises(ValueError, match="the state at position 0 is passed more than once"):
        dec.decode_streams(random_log_probs(4, 3, 8), [state, other, state])
    with pytest.raises(ValueError, match="decode_streams needs at least one state"):
        dec.decode_streams(random_log_probs(4, 1, 8)[:0], [])


@pytest.mark.parametrize("beam", [1, 3])
def test_storage_rows_mixed_with_own_states_stay_in_their_rows(beam: int) -> None:
    dec = make(beam)
    pooled, owned = dec.create_state(1, VOCAB), own_state(beam)
    twin = own_state(beam)
    lp = random_log_probs(6, 2, CHUNK * 3)
    for step in range(3):
        part = lp[:, step * CHUNK : (step + 1) * CHUNK]
        dec.decode_streams(part, [pooled, owned])  # stack / split path
        dec.decode_chunk(part[:1], twin)
        row = pooled.pool_row
        assert pooled.log_pb.data_ptr() == dec._rows.storage.log_pb[row].data_ptr()
    assert_same(dec.finalize_stream(pooled), dec.finalize_stream(twin))
    dec.decode_streams(lp[:1, :CHUNK], [pooled])  # and the gather path reads the same row
    dec.decode_chunk(lp[:1, :CHUNK], twin)
    assert_same(dec.finalize_stream(pooled), dec.finalize_stream(twin))


@pytest.mark.parametrize("beam", [1, 3])
def test_partials_read_back_the_frame_stats_of_the_rows(beam: int) -> None:
    dec = make(beam)
    states = [dec.create_state(1, VOCAB) for _ in range(3)]
    owned = [own_state(beam) for _ in range(3)]
    lp = random_log_probs(8, 3, 2 * CHUNK)
    lp[1, :, 1:] = -30.0  # stream 1 hears only blanks: no speech, all frames trailing blank
    lengths = torch.tensor([CHUNK, CHUNK, 5])
    dec.decode_streams(lp[:, :CHUNK], states, lengths)
    dec.decode_streams(lp[:, :CHUNK], owned, lengths)  # stacked path: stats read directly
    stats = [step.stats for step in dec.partials(states)]  # gathered from the storage
    assert stats == [step.stats for step in dec.partials(owned)]
    assert [s.num_frames for s in stats] == [CHUNK, CHUNK, 5]
    assert stats[1].has_speech is False
    assert stats[1].num_trailing_blank_frames == CHUNK
    dec.decode_streams(lp[:, CHUNK:], states)
    assert [s.stats.num_frames for s in dec.partials(states)] == [2 * CHUNK, 2 * CHUNK, CHUNK + 5]
    dec.reset_state(states[0], 1, VOCAB)
    assert [s.stats.num_frames for s in dec.partials(states)] == [0, 2 * CHUNK, CHUNK + 5]
