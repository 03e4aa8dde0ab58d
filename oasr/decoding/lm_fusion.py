"""Shallow fusion of a char n-gram LM into CTC prefix beam search.

A hypothesis's LM history is one automaton state id (`DecoderState.lm_state`), so the LM
score of every candidate extension of every hypothesis of every stream is one gather from the
LM's dense (S, V) tables. The stored CTC scores stay acoustic; the fused score of a prefix is
carried beside them (`DecoderState.lm_score`) and only the ranking adds the two. Merging two
alignments of the same prefix keeps one LM score: the LM score is a function of the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from oasr.decoding.config import GpuDecoderConfig
from oasr.decoding.state import DecoderState

if TYPE_CHECKING:
    from oasr.lm import CharNgramLm


@dataclass(frozen=True)
class LmFusion:
    """The LM tables on the decoder's device and the fusion weights.

    Attributes:
        gains: (S, V) float32 what emitting each unit after each state adds to a prefix's
            fused score: lm_weight * LM log-prob + lm_unit_bonus (+ lm_word_bonus on the word
            boundary), folded into one table so scoring a candidate is one gather.
        next_state: (S, V) int64 the state after each unit.
        end_gains: (S,) float32 lm_weight * LM log-prob of the sentence end after each state
            (scored when a hypothesis is finalised).
    """

    gains: torch.Tensor
    next_state: torch.Tensor
    end_gains: torch.Tensor

    @classmethod
    def build(cls, lm: CharNgramLm, config: GpuDecoderConfig, device: torch.device,
              boundary_id: int | None) -> LmFusion:
        """Tables of ``lm`` on ``device`` with ``config``'s weights."""
        lm = lm.to(device)
        bonus = torch.full((lm.vocab_size,), config.lm_unit_bonus, device=device)
        if boundary_id is not None:
            bonus[boundary_id] += config.lm_word_bonus
        weighted = lm.log_probs * config.lm_weight  # (S, V)
        return cls(gains=weighted + bonus, next_state=lm.next_state,
                   end_gains=weighted[:, lm.header.end_id].contiguous())

    @property
    def vocab_size(self) -> int:
        return self.gains.shape[1]

    def extension_scores(self, state: DecoderState, cand_tok: torch.Tensor) -> torch.Tensor:
        """(B, K, C) fused score of each hypothesis extended by each candidate."""
        flat = state.lm_state[:, :, None] * self.vocab_size + cand_tok[:, None, :]  # (B, K, C)
        return state.lm_score[:, :, None] + torch.take(self.gains, flat)

    def advance(self, state: DecoderState, parent: torch.Tensor, is_ext: torch.Tensor,
                token: torch.Tensor, ext_score: torch.Tensor) -> None:
        """Carry the (B, K) chosen hypotheses' LM state and score forward.

        Args:
            parent, is_ext, token: (B, K) the frame's choice (see `FrameChoice`).
            ext_score: (B, K) the chosen extension's fused score (meaningless when not one).
        """
        parent_state = state.lm_state.gather(1, parent)
        moved = torch.take(self.next_state, parent_state * self.vocab_size + token)
        state.lm_state = torch.where(is_ext, moved, parent_state)
        state.lm_score = torch.where(is_ext, ext_score, state.lm_score.gather(1, parent))

    def end_scores(self, lm_state: torch.Tensor) -> torch.Tensor:
        """(...) fused score of ending the sentence after each state in ``lm_state``."""
        return self.end_gains[lm_state]
