"""Word error rate and greedy CTC decoding for the recipe's evaluations."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two token sequences (substitution, insertion, deletion = 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


@dataclass
class ErrorCounts:
    """Accumulated word and character errors over a test set."""

    word_errors: int = 0
    words: int = 0
    char_errors: int = 0
    chars: int = 0
    utterances: int = 0

    def add(self, ref: str, hyp: str) -> None:
        self.word_errors += edit_distance(ref.split(), hyp.split())
        self.words += len(ref.split())
        self.char_errors += edit_distance(list(ref), list(hyp))
        self.chars += len(ref)
        self.utterances += 1

    @property
    def wer(self) -> float:
        """Word error rate in percent (0 when there are no reference words)."""
        return 100.0 * self.word_errors / max(self.words, 1)

    @property
    def cer(self) -> float:
        return 100.0 * self.char_errors / max(self.chars, 1)


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
