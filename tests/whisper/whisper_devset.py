"""The devset's real recordings and dense greedy decoding helpers for the Whisper tests."""

from __future__ import annotations

from dataclasses import dataclass

import soundfile as sf
import torch
from support.paths import DEVSET_DIR

from oasr.models.whisper import DecoderKv, WhisperCheckpoint
from oasr.models.whisper.decoding import GreedyHypothesis, greedy_search

DECODE_BATCH = 4  # rows per dense greedy batch: small buffers, few padded steps


@dataclass(frozen=True)
class Recording:
    name: str
    waveform: torch.Tensor  # (S,) float32, 16 kHz
    reference: str


def real_recordings() -> list[Recording]:
    """The devset's real recordings (manifest rows named ``real_*``), in manifest order."""
    rows = []
    for line in (DEVSET_DIR / "manifest.tsv").read_text().splitlines():
        name, _, text = line.partition("\t")
        if name.startswith("real_"):
            wave, rate = sf.read(DEVSET_DIR / name, dtype="float32")
            assert rate == 16000, f"{name} is {rate} Hz"
            rows.append(Recording(name, torch.from_numpy(wave), text))
    return rows


def rows_named(recordings: list[Recording], *stems: str) -> list[int]:
    """Indices of the recordings ``real_<stem>.wav`` (e.g. ``rows_named(recs, "jfk")``)."""
    names = [r.name for r in recordings]
    return [names.index(f"real_{stem}.wav") for stem in stems]


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
