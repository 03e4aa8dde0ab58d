"""The data layouts one frame of the batched CTC prefix beam search works on.

Built once per chunk so that a frame is a fixed, small set of tensor operations
(`oasr.decoding.search`): `ScoreLayout`, index tables of where each hypothesis and candidate
sits in the frame's score tensors; `candidate_tables`, everything the frames need that does
not depend on the search (candidate tokens and log-probs, each token's candidate column), one
`CandidateFrame` per frame, from the chunk's `ChunkFrames`; `FrameBuffers`, the score tensors every frame overwrites in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.decoding.config import DecoderConfig
from oasr.decoding.state import NEG_INF


@dataclass(frozen=True)
class ChunkFrames:
    """One chunk of log-probs prepared for searching.

    Attributes:
        log_probs: (B, T, V) float32, blank penalty applied.
        valid: (B, T) bool, False on the padding frames past a row's length.
        num_valid: (B,) int64 valid frames per row.
        frame_index: (B, T) int64 frame number of each frame counted from the row's reset.
        argmax: (B, T) int64 best token per frame.
        max_log_prob: (B, T) float32 its log-prob.
        top_log_probs, top_tokens: (B, T, C + 1) the frame's best C + 1 tokens, blank
            included, best first (C = ``config.num_candidates``); None for greedy search.
        all_valid: host bool, True when no row has padding (lets the search skip masking);
            known without a device sync only when ``lengths`` is None or a CPU tensor.
    """

    log_probs: torch.Tensor
    valid: torch.Tensor
    num_valid: torch.Tensor
    frame_index: torch.Tensor
    argmax: torch.Tensor
    max_log_prob: torch.Tensor
    all_valid: bool
    top_log_probs: torch.Tensor | None = None
    top_tokens: torch.Tensor | None = None


@dataclass(frozen=True)
class ScoreLayout:
    """Where things sit in one frame's score tensors, for K hypotheses and C candidates.

    The ranked scores are (B, K + K * C): the K hypotheses staying, then hypothesis k extended
    by candidate j at K + k * C + j (the layout the ranking's tie order depends on). Extension
    tensors are (B, K * (C + 1)): a block of C + 1 columns per hypothesis whose last column is
    scratch, so a token that is no candidate has a slot too and fixes need no masks.

    Attributes:
        blocks: (K,) int64 the first column of each hypothesis's block, k * (C + 1).
        scratch: (K,) int64 the last (scratch) column of each block.
        parent: (K + K * C,) int64 the hypothesis each ranked entry continues.
        column: (K + K * C,) int64 its candidate column (0 for a stay).
        slot: (K + K * C,) int64 its position in the extension tensors (0 for a stay).
        moved: (K + K * C,) int64 its position among the K * C extensions (0 for a stay).
    """

    blocks: torch.Tensor
    scratch: torch.Tensor
    parent: torch.Tensor
    column: torch.Tensor
    slot: torch.Tensor
    moved: torch.Tensor

    @classmethod
    def build(cls, beam_size: int, num_cand: int, device: torch.device) -> ScoreLayout:
        hyps = torch.arange(beam_size, device=device)
        cols = torch.arange(num_cand, device=device)
        zeros = torch.zeros_like(hyps)
        return cls(
            blocks=hyps * (num_cand + 1),
            scratch=hyps * (num_cand + 1) + num_cand,
            parent=torch.cat([hyps, hyps.repeat_interleave(num_cand)]),
            column=torch.cat([zeros, cols.repeat(beam_size)]),
            slot=torch.cat([zeros, (hyps[:, None] * (num_cand + 1) + cols).flatten()]),
            moved=torch.cat([zeros, torch.arange(beam_size * num_cand, device=device)]),
        )


@dataclass(frozen=True)
class CandidateFrame:
    """One frame's candidate extensions (views of a chunk's tables built once per chunk by
    `candidate_tables`); columns as in `ScoreLayout`.

    Attributes:
        lp: (B, V + 1) the frame's log-probs of token v at v + 1 (column 0: the empty
            prefix's "no token", 0.0).
        lp_blank: (B,) the blank's log-prob.
        tokens: (B, C) candidate tokens (distinct), best first.
        log_probs: (B, C + 1) their log-probs, -inf for those that may not extend a prefix
            and in the scratch column C.
        slot: (B, V + 1) int64 the column of token v at v + 1 (column 0: "no token"), C where
            the token is no candidate.
    """

    lp: torch.Tensor
    lp_blank: torch.Tensor
    tokens: torch.Tensor
    log_probs: torch.Tensor
    slot: torch.Tensor


def candidate_tables(chunk: ChunkFrames, config: DecoderConfig) -> list[CandidateFrame]:
    """Everything the frames of ``chunk`` need that does not depend on the search, computed
    for all frames at once (see `CandidateFrame`)."""
    lp = chunk.log_probs  # (B, T, V)
    cand_lp, cand_tok = chunk.top_log_probs, chunk.top_tokens  # (B, T, C), blank included
    assert cand_lp is not None and cand_tok is not None, "prepare_chunk skips top-k for greedy"
    batch, num_frames, vocab = lp.shape
    num_cand = cand_tok.shape[2]
    # Keep the best num_candidates non-blank tokens: drop the blank, or the spare last entry
    # when the blank was not among them.
    is_blank = cand_tok == config.blank_id
    drop = is_blank | (is_blank.logical_not().cumsum(dim=-1) > config.num_candidates(vocab))
    if config.min_token_log_prob is not None:
        drop = drop | (cand_lp < config.min_token_log_prob)
    padded_lp = torch.full((batch, num_frames, num_cand + 1), NEG_INF, device=lp.device)
    padded_lp[..., :num_cand] = cand_lp.masked_fill(drop, NEG_INF)
    slot = torch.full((batch, num_frames, vocab + 1), num_cand, dtype=torch.int64,
                      device=lp.device)
    columns = torch.arange(num_cand, device=lp.device).expand_as(cand_tok)
    slot.scatter_(2, cand_tok + 1, columns)  # (B, T, V + 1)
    shifted = torch.nn.functional.pad(lp, (1, 0))  # (B, T, V + 1)
    tables = [_by_frame(x) for x in (shifted, lp[:, :, config.blank_id], cand_tok, padded_lp, slot)]
    return [CandidateFrame(*parts) for parts in zip(*tables, strict=True)]


def _by_frame(table: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(B, T, ...) -> T contiguous (B, ...) tensors, with one copy and one unbind."""
    return table.transpose(0, 1).contiguous().unbind(0)


@dataclass(frozen=True)
class FrameBuffers:
    """Score tensors of one frame, allocated once per chunk and overwritten by every frame
    (each frame reads what it needs from them before the next one runs); shapes as in
    `ScoreLayout`.

    Attributes:
        scores: (B, K + K * C) the ranked scores; ``stay`` (B, K) and ``moves`` (B, K, C)
            are its two parts.
        ext: (B, K * (C + 1)) acoustic extension log-probs; ``ext_blocks`` (B, K, C + 1).
        lm_ext: (B, K, C) fused LM scores of the extensions (None without an LM).
    """

    scores: torch.Tensor
    stay: torch.Tensor
    moves: torch.Tensor
    ext: torch.Tensor
    ext_blocks: torch.Tensor
    lm_ext: torch.Tensor | None

    @classmethod
    def build(cls, batch: int, beam_size: int, num_cand: int, with_lm: bool,
              device: torch.device) -> FrameBuffers:
        k = beam_size
        scores = torch.empty((batch, k + k * num_cand), device=device)
        ext = torch.empty((batch, k * (num_cand + 1)), device=device)
        lm_ext = torch.empty((batch, k, num_cand), device=device) if with_lm else None
        return cls(scores=scores, stay=scores[:, :k], moves=scores[:, k:].view(batch, k, -1),
                   ext=ext, ext_blocks=ext.view(batch, k, -1), lm_ext=lm_ext)
