"""Shared pieces of the LM fusion tests: constructed log-prob matrices and the batched-vs-alone
check, over the bundled model's character units."""

from __future__ import annotations

import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.models.bundled import BUNDLED_UNITS
from oasr.text.tokenizer import CharTokenizer

UNITS = list(BUNDLED_UNITS)
V = len(UNITS)


def decoder(beam: int, lm=None, **kw) -> GpuStreamingDecoder:
    return GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam, **kw),
                               CharTokenizer.from_units(UNITS), device="cpu", lm=lm)


def spelled(frames: list[dict[str, float]]) -> torch.Tensor:
    """(1, T, V) log-probs: each frame's listed units get their probability, blank the rest."""
    probs = torch.full((len(frames), V), 1e-4)
    for t, frame in enumerate(frames):
        for unit, p in frame.items():
            probs[t, UNITS.index(unit)] = p
        probs[t, 0] = max(1e-4, 1.0 - sum(frame.values()))
    return (probs / probs.sum(dim=1, keepdim=True)).log()[None]


def best(dec: GpuStreamingDecoder, log_probs: torch.Tensor):
    """The best final hypothesis of one (1, T, V) utterance."""
    state = dec.create_state(1, V)
    dec.decode_chunk(log_probs, state)
    return dec.finalize_stream(state)[0]


def random_log_probs(batch: int, frames: int, seed: int, boundary_boost: float = 0.0) -> torch.Tensor:
    """(B, T, V) blank-heavy random log-probs, like a CTC model's; ``boundary_boost`` makes
    word boundaries likelier."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, V, generator=g) * 3
    logits[..., 0] += 2.0
    logits[..., UNITS.index("\u2581")] += boundary_boost
    return logits.log_softmax(dim=-1)


def assert_batched_equals_alone(lm, cfg: dict, beam: int = 5, chunk: int = 16) -> None:
    """Three streams of different lengths decoded together, chunk by chunk, give the partials
    and finals each gives decoded alone."""
    batched, single = decoder(beam, lm, **cfg), decoder(beam, lm, **cfg)
    lp = random_log_probs(3, 48, 3, boundary_boost=1.0)
    lengths = torch.tensor([48, 30, 41])
    states = [batched.create_state(1, V) for _ in range(3)]
    alone = [single.create_state(1, V) for _ in range(3)]
    for start in range(0, 48, chunk):
        chunk_len = (lengths - start).clamp(0, chunk)
        batched.decode_streams(lp[:, start:start + chunk], states, chunk_len)
        for b in range(3):
            single.decode_chunk(lp[b:b + 1, start:start + chunk], alone[b], chunk_len[b:b + 1])
        assert batched.partials(states) == single.partials(alone)
    assert [batched.finalize_stream(s) for s in states] == \
        [single.finalize_stream(s) for s in alone]
