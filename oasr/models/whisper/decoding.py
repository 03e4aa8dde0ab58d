"""Greedy Whisper decoding over any ``DecoderKvStore`` (dense or paged).

Logit rules (those of the reference CTranslate2 greedy search for a no-timestamps prompt): the
checkpoint's ``suppress_ids`` are never generated, and at the first generated step
``suppress_ids_begin`` (blank, end-of-transcript) are not either. Rows that emit the
end-of-transcript token are finished; the batch stops when every row is finished or after
``max_new_tokens`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.models.whisper.config import DecodingSpec
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.model import DecoderKvStore, WhisperModel


@dataclass(frozen=True)
class WhisperTranscript:
    """One row's result: generated text tokens (no prompt, no end token) and their text."""

    tokens: tuple[int, ...]
    text: str


def suppression_masks(spec: DecodingSpec, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive (V,) float32 masks: always-suppressed ids, and those suppressed at step one."""
    always = torch.zeros(vocab, device=device)
    ids = [t for t in spec.suppress_ids if 0 <= t < vocab]
    always[torch.tensor(ids, dtype=torch.long, device=device)] = float("-inf")
    first = always.clone()
    begin = [t for t in spec.suppress_ids_begin if 0 <= t < vocab]
    first[torch.tensor(begin, dtype=torch.long, device=device)] = float("-inf")
    return always, first


def default_max_new_tokens(model: WhisperModel, spec: DecodingSpec) -> int:
    """Tokens a row may generate: the decoder's positions minus the prompt."""
    return model.config.n_text_ctx - len(spec.prompt)


@torch.inference_mode()
def greedy_decode(
    model: WhisperModel,
    spec: DecodingSpec,
    kv: DecoderKvStore,
    batch_size: int,
    max_new_tokens: int | None = None,
) -> list[list[int]]:
    """Greedy tokens of ``batch_size`` rows whose cross K/V ``kv`` already holds.

    Args:
        model: the Whisper model.
        spec: prompt, end token and suppression lists.
        kv: an empty store of ``batch_size`` rows (self-attention holds nothing yet).
        batch_size: B.
        max_new_tokens: cap on generated tokens per row (default: all positions left).
    Returns:
        Per row the generated tokens, without the prompt and without the end token.
    """
    limit = default_max_new_tokens(model, spec) if max_new_tokens is None else max_new_tokens
    if not 1 <= limit <= default_max_new_tokens(model, spec):
        raise ValueError(
            f"max_new_tokens must be in 1..{default_max_new_tokens(model, spec)}, got {limit}"
        )
    device = model.device
    always, first = suppression_masks(spec, model.config.n_vocab, device)
    prompt = torch.tensor(spec.prompt, device=device).expand(batch_size, -1)  # (B, P)
    logits = model.decoder(prompt, kv)[:, -1] + first  # (B, V)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    steps: list[torch.Tensor] = []
    for step in range(limit):
        next_tokens = logits.argmax(dim=-1)  # (B,)
        next_tokens = torch.where(finished, torch.full_like(next_tokens, spec.eot), next_tokens)
        steps.append(next_tokens)
        finished |= next_tokens == spec.eot
        if step + 1 == limit or bool(finished.all()):
            break
        logits = model.decoder(next_tokens.unsqueeze(1), kv)[:, -1] + always
    grid = torch.stack(steps, dim=1).tolist()  # (B, steps)
    return [_until_eot(row, spec.eot) for row in grid]


def _until_eot(row: list[int], eot: int) -> list[int]:
    return row[: row.index(eot)] if eot in row else row


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished beam: text tokens, summed log-probability, and the length-normalised score."""

    tokens: tuple[int, ...]
    log_prob: float
    score: float


@torch.inference_mode()
def beam_search(
    model: WhisperModel,
    spec: DecodingSpec,
    kv: DecoderKv,
    beam_size: int,
    max_new_tokens: int | None = None,
    length_penalty: float = 1.0,
) -> list[BeamHypothesis]:
    """Beam search of each of ``kv``'s B rows on dense per-group buffers.

    Every step keeps ``beam_size`` live beams per row (``kv.select`` copies the parents' K/V,
    so repeated parents are fine here, unlike on the paged pool). A candidate ending in the end
    token finishes with score ``log_prob / len ** length_penalty`` (len counts the end token);
    a row stops once it has ``beam_size`` finished hypotheses, all rows stop at the token cap.

    Args:
        kv: an empty dense store of B rows (cross K/V stored, no tokens yet).
    Returns:
        Per row the best hypothesis.
    """
    limit = max_new_tokens or default_max_new_tokens(model, spec)
    batch, device = kv.batch_size, model.device
    always, first = suppression_masks(spec, model.config.n_vocab, device)
    prompt = torch.tensor(spec.prompt, device=device).expand(batch, -1)
    log_probs = torch.log_softmax(model.decoder(prompt, kv)[:, -1] + first, dim=-1)  # (B, V)
    scores = torch.zeros(batch, 1, device=device)  # (B, K) summed log-probs of live beams
    history = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)  # (B, K, t)
    finished: list[list[BeamHypothesis]] = [[] for _ in range(batch)]
    for step in range(limit):
        vocab = log_probs.size(-1)
        total = (scores.unsqueeze(-1) + log_probs.view(batch, -1, vocab)).view(batch, -1)
        top_scores, top_ids = total.topk(2 * beam_size, dim=-1)  # (B, 2K)
        parents, tokens = top_ids // vocab, top_ids % vocab
        keep = _collect_finished(finished, top_scores, parents, tokens, history, spec.eot,
                                 beam_size, length_penalty, last_step=step + 1 == limit)
        if all(len(f) >= beam_size for f in finished) or step + 1 == limit:
            break
        scores = top_scores.gather(1, keep)  # (B, K)
        chosen_parents, chosen_tokens = parents.gather(1, keep), tokens.gather(1, keep)
        width = history.size(1)
        flat = (torch.arange(batch, device=device).unsqueeze(1) * width + chosen_parents).view(-1)
        kv.select(flat)
        history = torch.cat([history.view(batch * width, -1)[flat].view(batch, beam_size, -1),
                             chosen_tokens.unsqueeze(-1)], dim=-1)
        logits = model.decoder(chosen_tokens.view(-1, 1), kv)[:, -1] + always  # (B*K, V)
        log_probs = torch.log_softmax(logits, dim=-1)
    return [max(f, key=lambda h: h.score) for f in finished]


def _collect_finished(
    finished: list[list[BeamHypothesis]],
    top_scores: torch.Tensor,
    parents: torch.Tensor,
    tokens: torch.Tensor,
    history: torch.Tensor,
    eot: int,
    beam_size: int,
    length_penalty: float,
    last_step: bool,
) -> torch.Tensor:
    """Move end-token candidates (all candidates at the last step) into ``finished``; returns
    (B, K) indices into the 2K candidates of the best ``beam_size`` that go on."""
    keep_rows = []
    for b, row in enumerate(finished):
        keep: list[int] = []
        candidates = zip(top_scores[b].tolist(), parents[b].tolist(), tokens[b].tolist(), strict=True)
        for j, (score, parent, token) in enumerate(candidates):  # best first
            if len(keep) == beam_size:
                break  # end tokens ranked below the kept beams are not hypotheses
            prefix = history[b, parent].tolist()
            if token == eot or last_step:
                text = prefix if token == eot else prefix + [token]
                if len(row) < beam_size:
                    norm = max(len(text), 1) ** length_penalty
                    row.append(BeamHypothesis(tuple(text), score, score / norm))
            else:
                keep.append(j)
        keep_rows.append(keep + [keep[-1] if keep else 0] * (beam_size - len(keep)))
    return torch.tensor(keep_rows, dtype=torch.long, device=top_scores.device)
