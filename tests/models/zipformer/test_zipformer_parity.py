"""oasr's Zipformer2 against icefall's own outputs (fixture: icefall commit 36e0420c).

Tolerances: 1e-4 abs on encoder outputs, states, decoder and joiner outputs; 2e-4 on CTC
log-probs; tokens exact (the fixture README measures float64-vs-float32 noise <= 3.9e-6 on the
encoder and 1.9e-5 on CTC log-probs, and decision margins of 6.2e-3 / 1.7e-3).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zipformer_helpers import fixture_model, utterances

from oasr.models.zipformer.states import EMBED_STATE, PROCESSED_STATE, layer_state_name

TOL = 1e-4
CTC_TOL = 2e-4
STREAMING = [(16, 64), (32, 128)]


def _max_diff(a: torch.Tensor | np.ndarray, b: np.ndarray) -> float:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b).max())


@torch.no_grad()
def test_full_context_encoder_and_ctc(ref):
    model = fixture_model(-1, -1)
    enc, lens = model.forward_encoder(torch.from_numpy(ref["feats"]), torch.from_numpy(ref["feats_lens"]))
    assert lens.tolist() == ref["full_encoder_out_lens"].tolist()
    assert _max_diff(enc, ref["full_encoder_out"]) < TOL
    assert _max_diff(model.ctc_log_probs(enc), ref["full_ctc_logp"]) < CTC_TOL
    for i, utt in enumerate(utterances(ref)):  # each alone: no batch padding
        alone, _ = model.forward_encoder(utt[None], torch.tensor([utt.shape[0]]))
        assert _max_diff(alone[0], ref[f"full_alone_encoder_out_u{i}"]) < TOL


@pytest.mark.parametrize(("chunk", "left"), STREAMING)
@torch.no_grad()
def test_simulated_streaming(ref, chunk, left):
    model = fixture_model(chunk, left)
    enc, _ = model.forward_encoder(torch.from_numpy(ref["feats"]), torch.from_numpy(ref["feats_lens"]))
    assert _max_diff(enc, ref[f"sim{chunk}_encoder_out"]) < TOL


@pytest.mark.parametrize(("chunk", "left"), STREAMING)
def test_streaming_batched_every_chunk(ref, decode_loop, chunk, left):
    records = decode_loop(fixture_model(chunk, left), utterances(ref))
    for i, rec in enumerate(records):
        assert rec.lens == ref[f"stream{chunk}_chunk_lens_u{i}"].tolist()
        want = ref[f"stream{chunk}_chunks_u{i}"]
        for k, (got, n) in enumerate(zip(rec.chunks, rec.lens, strict=True)):
            assert _max_diff(got[:n], want[k, :n]) < TOL, f"u{i} chunk {k}"


@pytest.mark.parametrize(("chunk", "left"), STREAMING)
def test_streaming_alone(ref, decode_loop, chunk, left):
    model = fixture_model(chunk, left)
    for i, utt in enumerate(utterances(ref)):
        (rec,) = decode_loop(model, [utt])
        got = torch.cat([c[:n] for c, n in zip(rec.chunks, rec.lens, strict=True)])
        assert _max_diff(got, ref[f"stream{chunk}_alone_encoder_out_u{i}"]) < TOL


def test_states_after_first_chunk_in_icefall_layout(ref, decode_loop):
    model = fixture_model(16, 64)
    records = decode_loop(model, utterances(ref))
    states = {}  # the batch of 2 after chunk 0, each spec's rows joined on its slot axis
    for spec in model.state_specs():
        rows = [r.states_after_first[spec.name] for r in records]  # type: ignore[index]
        states[spec.name] = torch.cat(rows, dim=spec.slot_axis)
    flat = model.get_init_states(2)
    assert len(flat) == len(states)
    for layer in range(6):
        for name in ("cached_key", "cached_nonlin_attn", "cached_val1", "cached_val2",
                     "cached_conv1", "cached_conv2"):
            want = ref[f"stream16_state_chunk0_layer{layer}_{name}"]
            assert _max_diff(states[layer_state_name(layer, name)], want) < TOL, (layer, name)
    embed = states[EMBED_STATE]
    assert _max_diff(embed, ref["stream16_state_chunk0_embed_left_pad"]) < TOL * max(1.0, float(embed.abs().max()))
    assert states[PROCESSED_STATE].dtype == torch.int32
    assert states[PROCESSED_STATE].tolist() == ref["stream16_state_chunk0_processed_lens"].tolist()


def test_icefall_list_api_matches_named_states(ref):
    model = fixture_model(16, 64)
    utt = utterances(ref)[0]
    window = utt[None, : model.config.window_frames]
    flat = model.get_init_states(1)
    with torch.no_grad():
        out, lens, new = model.streaming_forward(window, torch.tensor([window.shape[1]]), flat)
    assert len(flat) == 6 * 6 + 2 and [t.shape for t in new] == [t.shape for t in flat]
    assert _max_diff(out[0, : int(lens[0])], ref["stream16_alone_encoder_out_u0"][:8]) < TOL
    assert _max_diff(new[-2], ref["stream16_state_chunk0_embed_left_pad"][:1]) < 1e-3


@pytest.mark.parametrize("chunk", [16, 32])
@torch.no_grad()
def test_streaming_ctc(ref, chunk):
    model = fixture_model(chunk, 4 * chunk)
    logp = model.ctc_log_probs(torch.from_numpy(ref[f"stream{chunk}_encoder_out"]))
    assert _max_diff(logp, ref[f"stream{chunk}_ctc_logp"]) < CTC_TOL


@torch.no_grad()
def test_decoder_and_joiner(ref):
    model = fixture_model(16, 64)
    dec = model.decoder(torch.from_numpy(ref["decoder_in"]))  # (2, D)
    assert _max_diff(dec[:, None], ref["decoder_out"]) < TOL
    enc = torch.from_numpy(ref["stream16_encoder_out"][:, :5])  # (2, 5, C)
    logits = model.joiner(enc, dec[:, None])  # (2, 5, V)
    assert _max_diff(logits, ref["joiner_out"].reshape(logits.shape)) < TOL


@pytest.mark.parametrize("chunk", [16, 32])
@torch.no_grad()
def test_greedy_search_batch(ref, chunk):
    model = fixture_model(chunk, 4 * chunk)
    hyps = model.greedy_search(torch.from_numpy(ref[f"stream{chunk}_encoder_out"]),
                               torch.from_numpy(ref[f"stream{chunk}_encoder_out_lens"]))
    for i, hyp in enumerate(hyps):
        assert hyp == ref[f"stream{chunk}_greedy_batch_hyp_u{i}"].tolist()
        assert len(hyp) > 3


@pytest.mark.parametrize("chunk", [16, 32])
def test_streaming_greedy_chunk_by_chunk(ref, decode_loop, chunk):
    """icefall's streaming greedy: per chunk, over every frame of the chunk (it ignores the
    valid length of a last chunk), one hypothesis carried across chunks."""
    model = fixture_model(chunk, 4 * chunk)
    records = decode_loop(model, utterances(ref))
    states = model.new_greedy_states(len(records))
    with torch.no_grad():
        for i, rec in enumerate(records):
            for out in rec.chunks:
                model.greedy_step(model.joiner.encoder_proj(out[None]), [out.shape[0]], [states[i]])
    for i, state in enumerate(states):
        assert state.tokens == ref[f"stream{chunk}_greedy_hyp_u{i}"].tolist()


@torch.no_grad()
def test_modified_beam_search(ref, decode_loop):
    """Beam 1 is the greedy search; a beam carried chunk by chunk equals one search over the
    whole output; a batch equals each utterance alone."""
    model = fixture_model(16, 64)
    enc = torch.from_numpy(ref["stream16_encoder_out"])
    lens = torch.from_numpy(ref["stream16_encoder_out_lens"])
    assert model.modified_beam_search(enc, lens, beam=1) == model.greedy_search(enc, lens)
    batched = model.modified_beam_search(enc, lens, beam=4)
    for i in range(2):
        n = int(lens[i])
        assert model.modified_beam_search(enc[i : i + 1, :n], lens[i : i + 1], beam=4) == [batched[i]]
        states = model.new_beam_states(1)
        for start in range(0, n, 8):
            chunk = enc[i : i + 1, start : min(start + 8, n)]
            model.beam_step(model.joiner.encoder_proj(chunk), [chunk.shape[1]], states, 4)
        assert list(states[0].best().tokens) == batched[i]
        assert len(batched[i]) > 3
