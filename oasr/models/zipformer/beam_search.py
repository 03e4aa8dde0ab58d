"""Modified beam search for the stateless transducer (icefall's ``modified_beam_search``).

At most one symbol per frame: at every frame each hypothesis is extended by blank (kept as is)
or by one token, the ``beam`` best (hypothesis, token) pairs of the utterance survive, and
hypotheses with the same token sequence are merged (their probabilities added). One decoder
and one joiner call per frame for every live hypothesis of every utterance in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from oasr.models.zipformer.transducer import Joiner, StatelessDecoder, start_context


@dataclass
class BeamHyp:
    """One hypothesis: its token sequence (after the start context), the frame of each token,
    and its total log-probability."""

    tokens: tuple[int, ...]
    frames: tuple[int, ...]
    log_prob: float


@dataclass
class BeamState:
    """One utterance's live hypotheses (keyed by token sequence) and frames consumed."""

    start: tuple[int, ...]
    hyps: dict[tuple[int, ...], BeamHyp] = field(default_factory=dict)
    num_frames: int = 0

    @classmethod
    def new(cls, context_size: int, blank_id: int) -> BeamState:
        state = cls(tuple(start_context(context_size, blank_id)))
        state.reset()
        return state

    def reset(self) -> None:
        self.hyps = {(): BeamHyp((), (), 0.0)}
        self.num_frames = 0

    def best(self) -> BeamHyp:
        """The most probable hypothesis, log-probability normalised by its length (icefall's
        ``get_most_probable(length_norm=True)``: the start context counts)."""
        ctx = len(self.start)
        return max(self.hyps.values(), key=lambda h: h.log_prob / (ctx + len(h.tokens)))

    def context(self, hyp: BeamHyp, size: int) -> list[int]:
        return list((self.start + hyp.tokens)[-size:])


def beam_steps(decoder: StatelessDecoder, joiner: Joiner, enc_proj: Tensor, lengths: list[int],
               states: list[BeamState], beam: int, blank_id: int, unk_id: int | None) -> None:
    """Advance every utterance's beam over its frames (in place).

    Args:
        enc_proj: (B, T, joiner_dim) encoder frames after ``joiner.encoder_proj``.
        lengths: valid frames per row; states: one per row.
        beam: hypotheses kept per utterance; blank and ``unk_id`` extend no sequence.
    """
    ctx = decoder.context_size
    device = enc_proj.device
    for t in range(enc_proj.shape[1]):
        rows = [b for b in range(len(states)) if t < lengths[b]]
        if not rows:
            break
        hyps = [(b, h) for b in rows for h in states[b].hyps.values()]
        contexts = torch.tensor([states[b].context(h, ctx) for b, h in hyps], device=device)
        owner = torch.tensor([b for b, _ in hyps], device=device)
        logits = joiner(enc_proj[owner, t], decoder(contexts), project_encoder=False)  # (H, V)
        scores = logits.float().log_softmax(dim=-1)
        scores += torch.tensor([h.log_prob for _, h in hyps], device=device).unsqueeze(1)
        vocab = scores.shape[1]
        start = 0
        for b in rows:
            n = len(states[b].hyps)
            flat = scores[start : start + n].reshape(-1)  # (n * V,)
            top = flat.topk(min(beam, flat.numel()))
            chosen = [(hyps[start + i // vocab][1], i % vocab, s)
                      for i, s in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
            states[b].hyps = _extend(chosen, states[b].num_frames, blank_id, unk_id)
            states[b].num_frames += 1
            start += n


def _extend(chosen: list[tuple[BeamHyp, int, float]], frame: int, blank_id: int,
            unk_id: int | None) -> dict[tuple[int, ...], BeamHyp]:
    out: dict[tuple[int, ...], BeamHyp] = {}
    for hyp, token, score in chosen:
        if token in (blank_id, unk_id):
            new = BeamHyp(hyp.tokens, hyp.frames, score)
        else:
            new = BeamHyp(hyp.tokens + (token,), hyp.frames + (frame,), score)
        old = out.get(new.tokens)
        if old is not None:  # the same sequence reached two ways: add the probabilities
            hi, lo = max(old.log_prob, score), min(old.log_prob, score)
            new.log_prob = hi + math.log1p(math.exp(lo - hi))
            new.frames = old.frames
        out[new.tokens] = new
    return out
