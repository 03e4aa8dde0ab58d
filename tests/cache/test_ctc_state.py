"""CtcStateCacheManager with the real GpuStreamingDecoder (greedy and beam): one state per
stream in the decoder row of its slot, freed explicitly."""

import gc

import pytest
import torch

from oasr.cache import CtcStateCacheManager
from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder

V = 5  # blank 0, tokens 1..4


def log_probs(path, vocab=V):
    """(1, T, V) log-probs whose argmax follows ``path``."""
    x = torch.full((1, len(path), vocab), -8.0)
    for t, tok in enumerate(path):
        x[0, t, tok] = -0.01
    return x.log_softmax(-1)


@pytest.mark.parametrize("beam", [1, 3])
def test_decodes_through_handles_in_rows_of_one_storage(beam):
    ctc = CtcStateCacheManager(GpuDecoderConfig(beam_size=beam), device="cpu")
    ctc.allocate_stream(1, batch=1, vocab_size=V)
    ctc.allocate_stream(2, batch=1, vocab_size=V)
    h1, h2 = ctc.get_decoder(1), ctc.get_decoder(2)
    h1.decode_chunk(log_probs([1, 1, 0, 2]))
    h2.decode_chunk(log_probs([3, 0, 3]))
    assert h1.step(log_probs([0, 4])).tokens == [1, 2, 4]
    assert h2.partial().tokens == [3, 3]
    assert h1.finalize_stream()[0].tokens == [1, 2, 4]
    assert h1.config.beam_size == beam
    assert (ctc.get_state(1).pool_row, ctc.get_state(2).pool_row) == (0, 1)  # lowest free rows
    row0 = ctc.get_state(1).log_pb.data_ptr()
    ctc.free_stream(1)
    assert 1 not in ctc
    ctc.allocate_stream(3, batch=1, vocab_size=V)
    assert ctc.get_state(3).log_pb.data_ptr() == row0  # the freed row's buffers, reused
    assert ctc.get_decoder(3).partial().tokens == []  # reset on reuse
    ctc.get_decoder(3).decode_chunk(log_probs([2]))
    assert ctc.get_decoder(3).partial().tokens == [2]
    assert ctc.get_decoder(2).partial().tokens == [3, 3]  # other streams untouched


def test_a_freed_slot_row_is_reused_by_the_next_stream_of_that_slot():
    decoder = GpuStreamingDecoder(GpuDecoderConfig(beam_size=3), device="cpu")
    ctc = CtcStateCacheManager(decoder)
    ctc.allocate_stream(10, 1, V, slot=5)
    ctc.allocate_stream(11, 1, V, slot=2)
    first = ctc.get_state(10)
    assert first.pool_row == 5 and ctc.get_state(11).pool_row == 2
    storage_row = decoder._rows.storage.log_pb[5].data_ptr()
    assert first.log_pb.data_ptr() == storage_row
    ctc.get_decoder(10).decode_chunk(log_probs([1, 0, 2]))
    ctc.free_stream(10)
    ctc.allocate_stream(12, 1, V, slot=5)  # the next stream of slot 5
    second = ctc.get_state(12)
    assert second is not first and second.pool_row == 5
    assert second.log_pb.data_ptr() == storage_row  # same device row, no new buffer
    assert ctc.get_decoder(12).partial().tokens == []
    with pytest.raises(ValueError, match="decoder row 5 is already held"):
        ctc.allocate_stream(13, 1, V, slot=5)
    assert 13 not in ctc


def test_rows_are_freed_explicitly_never_by_a_finalizer():
    decoder = GpuStreamingDecoder(GpuDecoderConfig(), device="cpu")
    ctc = CtcStateCacheManager(decoder)
    ctc.allocate_stream(1, 1, V, slot=0)
    kept = ctc.get_state(1)  # a live reference: no garbage collection could free the row
    ctc.free_stream(1)
    assert decoder._rows.num_attached == 0  # free_stream alone gave the row back
    ctc.allocate_stream(2, 1, V, slot=0)
    # a state dropped without a free keeps its row, however often the collector runs
    orphan = decoder.create_state(1, V, row=3)
    del orphan
    gc.collect()
    with pytest.raises(ValueError, match="decoder row 3 is already held"):
        decoder.create_state(1, V, row=3)
    # the freed state cannot decode into its old row's next owner
    with pytest.raises(ValueError, match="decoder state of row 0 was freed"):
        decoder.decode_chunk(log_probs([1]), kept)
    with pytest.raises(ValueError, match="decoder state of row 0 was freed"):
        decoder.partial(kept)


def test_double_free_raises():
    decoder = GpuStreamingDecoder(GpuDecoderConfig(), device="cpu")
    ctc = CtcStateCacheManager(decoder)
    ctc.allocate_stream(1, 1, V, slot=4)
    state = ctc.get_state(1)
    ctc.free_stream(1)
    with pytest.raises(KeyError, match="stream 1 has no CTC decoder state"):
        ctc.free_stream(1)
    with pytest.raises(ValueError, match="double free of decoder row 4"):
        decoder.free_state(state)


def test_multi_row_states_own_their_tensors():
    ctc = CtcStateCacheManager(GpuDecoderConfig(), device="cpu")
    ctc.allocate_stream(1, 2, V)
    state = ctc.get_state(1)
    assert state.batch_size == 2 and state.pool_row is None
    ctc.get_decoder(1).decode_chunk(torch.cat([log_probs([1, 2]), log_probs([3, 3])]))
    assert ctc.get_decoder(1).partial(1).tokens == [3]
    ctc.free_stream(1)
    with pytest.raises(ValueError, match="takes no storage row"):
        ctc.decoder.create_state(2, V, row=0)


def test_reset_stream_starts_a_new_segment():
    decoder = GpuStreamingDecoder(GpuDecoderConfig(), device="cpu")
    ctc = CtcStateCacheManager(decoder)
    assert ctc.decoder is decoder
    ctc.allocate_stream(1, vocab_size=V)
    ctc.get_decoder(1).decode_chunk(log_probs([1, 2]))
    ctc.reset_stream(1)
    assert ctc.get_decoder(1).partial().tokens == []
    assert int(ctc.get_state(1).num_frames[0]) == 0


def test_errors():
    ctc = CtcStateCacheManager(GpuDecoderConfig(), device="cpu")
    ctc.allocate_stream(1, vocab_size=V)
    with pytest.raises(ValueError, match="stream 1 already has"):
        ctc.allocate_stream(1, vocab_size=V)
    for call in (ctc.free_stream, ctc.reset_stream, ctc.get_state, ctc.get_decoder):
        with pytest.raises(KeyError, match="stream 9 has no CTC decoder state"):
            call(9)
    with pytest.raises(ValueError, match="only when the manager builds"):
        CtcStateCacheManager(GpuStreamingDecoder(device="cpu"), device="cpu")
    ctc.free_stream(1)
    with pytest.raises(KeyError):
        ctc.get_decoder(1)


def test_allocate_takes_vocab_size_positionally_and_requires_it():
    ctc = CtcStateCacheManager(GpuDecoderConfig(), device="cpu")
    ctc.allocate_stream(1, 1, V)  # allocate_stream(sid, batch, vocab_size)
    ctc.get_decoder(1).decode_chunk(log_probs([2, 0, 3]))
    assert ctc.get_decoder(1).partial().tokens == [2, 3]
    with pytest.raises(ValueError, match=r"allocate_stream\(2\) needs vocab_size"):
        ctc.allocate_stream(2, 1)
    assert 2 not in ctc
