"""CtcStateCacheManager with the real GpuStreamingDecoder (greedy and beam)."""

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
def test_decodes_through_handles_and_pools_states(beam):
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
    state1 = ctc.get_state(1)
    ctc.free_stream(1)
    assert ctc.num_pooled_states == 1 and 1 not in ctc
    ctc.allocate_stream(3, batch=1, vocab_size=V)
    assert ctc.get_state(3) is state1  # reused, not reallocated
    assert ctc.num_pooled_states == 0
    assert ctc.get_decoder(3).partial().tokens == []  # reset on reuse
    ctc.get_decoder(3).decode_chunk(log_probs([2]))
    assert ctc.get_decoder(3).partial().tokens == [2]
    assert ctc.get_decoder(2).partial().tokens == [3, 3]  # other streams untouched


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
    ctc.allocate_stream(1, 1, V)  # seed §4.5: allocate_stream(sid, batch, vocab_size)
    ctc.get_decoder(1).decode_chunk(log_probs([2, 0, 3]))
    assert ctc.get_decoder(1).partial().tokens == [2, 3]
    with pytest.raises(ValueError, match=r"allocate_stream\(2\) needs vocab_size"):
        ctc.allocate_stream(2, 1)
    assert 2 not in ctc
