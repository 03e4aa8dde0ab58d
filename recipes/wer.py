"""Word error rate and greedy CTC decoding for the recipe's evaluations."""

from __future__ import annotations

import torch
from torch import Tensor

from oasr.text.wer import ErrorCounts, edit_distance

__all__ = ["ErrorCounts", "decode_batch", "edit_distance", "greedy_ctc"]


def greedy_ctc(log_probs: Tensor, lengths: Tensor, blank_id: int = 0) -> list[list[int]]:
    """Best-path CTC decoding: argmax per frame, merge repeats, drop blanks.

    Args:
        log_probs: (B, T, V) log-probabilities.
        lengths: (B,) valid frames per row.
    Returns:
        B lists of token ids.
    """
    best = log_probs.argmax(dim=-1).cpu()  # (B, T)
    out: list[list[int]] = []
    for row, n in zip(best.tolist(), lengths.tolist(), strict=True):
        ids, prev = [], blank_id
        for t in row[:n]:
            if t != prev and t != blank_id:
                ids.append(t)
            prev = t
        out.append(ids)
    return out


@torch.no_grad()
def decode_batch(model, feats: Tensor, feat_lens: Tensor, chunk_size: int,
                 left_chunks: int = -1) -> list[str]:
    """Greedy transcripts of a padded batch with the chunk-masked full forward.

    ``chunk_size`` > 0: the streaming chunk mask (equal to chunk-by-chunk decoding);
    < 0: full context.
    """
    enc, enc_lens = model(feats, feat_lens, chunk_size, left_chunks)
    ids = greedy_ctc(model.ctc_log_probs(enc), enc_lens, model.config.ctc_blank_id)
    return [model.tokenizer.decode(seq) for seq in ids]
