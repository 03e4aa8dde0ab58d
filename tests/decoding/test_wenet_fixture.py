"""Decoding the WeNet fixture model's CTC log-probs (127 frames, 32 units) in 16-frame chunks."""

import numpy as np
import pytest
import torch
from support.paths import WENET_FIXTURE_DIR

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder

OUTPUTS = WENET_FIXTURE_DIR / "reference_outputs.npz"


@pytest.fixture(scope="module")
def fixture_log_probs() -> dict[str, torch.Tensor]:
    data = np.load(OUTPUTS)
    return {k: torch.from_numpy(data[k]) for k in data.files if k.startswith("ctc_logp")}


@pytest.mark.parametrize("beam", [1, 10])
def test_streaming_chunks_of_wenet_log_probs_equal_full_utterance(
    fixture_log_probs: dict[str, torch.Tensor], beam: int
) -> None:
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam), device="cpu")
    chunked = fixture_log_probs["ctc_logp_chunked_chunk16_leftall"]  # (127, 32)
    full = fixture_log_probs["ctc_logp_full_chunk16_leftall"]
    streams = [dec.create_state(1, 32) for _ in range(2)]
    other = fixture_log_probs["ctc_logp_chunked_chunk16_left4"]
    for lo in range(0, chunked.shape[0], 16):
        dec.decode_streams(torch.stack([chunked[lo : lo + 16], other[lo : lo + 16]]), streams)
    whole = dec.create_state(1, 32)
    dec.decode_chunk(full[None], whole)
    got, want = dec.finalize_stream(streams[0]), dec.finalize_stream(whole)
    assert len(got[0].tokens) > 10
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.timestamps for h in got] == [h.timestamps for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
    alone = dec.create_state(1, 32)
    dec.decode_chunk(other[None], alone)
    batched, single = dec.finalize_stream(streams[1]), dec.finalize_stream(alone)
    assert [(h.tokens, h.timestamps) for h in batched] == [(h.tokens, h.timestamps) for h in single]
    assert [h.score for h in batched] == pytest.approx([h.score for h in single], abs=1e-3)
