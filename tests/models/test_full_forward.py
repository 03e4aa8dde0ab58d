"""Full-utterance encoder forward (chunk masks) against WeNet's reference outputs."""

from __future__ import annotations

import pytest
import torch
from model_testutil import max_diff

from oasr.models import AsrModel

CASES = [
    ("chunk16_leftall", 16, -1),
    ("chunk16_left4", 16, 4),
    ("fullcontext", -1, -1),
]


@pytest.mark.parametrize(("name", "chunk", "left"), CASES)
def test_full_forward_matches_wenet(wenet_model: AsrModel, feats, reference, name, chunk, left):
    with torch.no_grad():
        enc, masks = wenet_model.encoder(feats, torch.tensor([512]), chunk, left)
        logp = wenet_model.ctc_log_probs(enc)
    enc_key = f"enc_full_{name}" if chunk > 0 else "enc_fullcontext"
    ctc_key = f"ctc_logp_full_{name}" if chunk > 0 else "ctc_logp_fullcontext"
    assert masks.shape == (1, 1, 127) and bool(masks.all())
    assert max_diff(enc[0], reference[enc_key]) <= 1e-4
    assert max_diff(logp[0], reference[ctc_key]) <= 1e-4


def test_left_chunks_change_the_output(wenet_model: AsrModel, feats):
    """A mask that ignored num_decoding_left_chunks would make these equal."""
    with torch.no_grad():
        all_left, _ = wenet_model.encoder(feats, torch.tensor([512]), 16, -1)
        left4, _ = wenet_model.encoder(feats, torch.tensor([512]), 16, 4)
    assert max_diff(all_left[:, :80], left4[:, :80]) <= 1e-5
    assert max_diff(all_left[:, 80:], left4[:, 80:]) > 1e-2


def test_padded_batch_equals_single_rows(wenet_model: AsrModel, feats):
    lengths = torch.tensor([512, 300])
    batch = torch.zeros(2, 512, 80)
    batch[0] = feats[0]
    batch[1, :300] = feats[0, 100:400]
    with torch.no_grad():
        enc, lens = wenet_model(batch, lengths, 16, -1)
        alone, _ = wenet_model(feats[:, 100:400], torch.tensor([300]), 16, -1)
    assert lens.tolist() == [127, 74]
    assert max_diff(enc[1, :74], alone[0]) <= 1e-5
