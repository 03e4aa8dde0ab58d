"""The torch Whisper against CTranslate2's own Whisper (a test-only dependency) on the devset's
real recordings: the same greedy tokens from the same features, and the WER they score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.models.whisper import WhisperCheckpoint
from oasr.text.wer import ErrorCounts, normalize_transcript

pytestmark = pytest.mark.slow


def test_greedy_tokens_match_ctranslate2(checkpoint: WhisperCheckpoint, devset_mel: torch.Tensor,
                                         dense_tokens: list[list[int]], dense_hyps,
                                         recordings) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is the reference")
    reference = ctranslate2.models.Whisper(
        str(checkpoint.path), device="cpu", compute_type="float32", intra_threads=1
    )
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(devset_mel.numpy()))
    results = reference.generate(features, [list(checkpoint.spec.prompt)] * len(recordings),
                                 beam_size=1, return_scores=True, return_no_speech_prob=True)
    theirs = [r.sequences_ids[0] for r in results]
    mismatched = [r.name for r, a, b in zip(recordings, dense_tokens, theirs, strict=True) if a != b]
    assert not mismatched, f"tokens differ from ctranslate2 on {mismatched}"
    assert all(len(t) >= 3 for t in dense_tokens)
    # its score is the summed log-probability (end token included) per text token
    ours_scores = [h.log_prob / len(h.tokens) for h in dense_hyps]
    np.testing.assert_allclose(ours_scores, [r.scores[0] for r in results], atol=2e-4)
    np.testing.assert_allclose([h.no_speech_prob for h in dense_hyps],
                               [r.no_speech_prob for r in results], atol=2e-5)


def test_devset_wer_at_most_5_percent(checkpoint: WhisperCheckpoint,
                                      dense_tokens: list[list[int]], recordings) -> None:
    counts = ErrorCounts()
    for rec, tokens in zip(recordings, dense_tokens, strict=True):
        counts.add(rec.reference, normalize_transcript(checkpoint.tokenizer.decode(tokens)))
    print(f"whisper tiny.en greedy WER on {counts.utterances} real devset files: "
          f"{counts.wer:.2f}% ({counts.word_errors}/{counts.words} words)")
    assert counts.wer <= 5.0
