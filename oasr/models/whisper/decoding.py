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
