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
        log_probs: (S, V) float32 LM log-prob of each unit after each state.
        next_state: (S, V) int64 the state after each unit.
        unit_bonus: (V,) float32 per emitted unit: lm_unit_bonus, + lm_word_bonus on the word
            boundary.
        weight: lm_weight.
        end_id: the sentence-end unit (scored when a hypothesis is finalised).
    """

    log_probs: torch.Tensor
    next_state: torch.Tensor
    unit_bonus: torch.Tensor
    weight: float
    end_id: int

    @classmethod
    def build(cls, lm: CharNgramLm, config: GpuDecoderConfig, device: torch.device,
              boundary_id: int | None) -> LmFusion:
        """Tables of ``lm`` on ``device`` with ``config``'s weights."""
        lm = lm.to(device)
        bonus = torch.full((lm.vocab_size,), config.lm_unit_bonus, device=device)
        if boundary_id is not None:
            bonus[boundary_id] += config.lm_word_bonus
        return cls(log_probs=lm.log_probs, next_state=lm.next_state, unit_bonus=bonus,
                   weight=config.lm_weight, end_id=lm.header.end_id)

    @property
    def vocab_size(self) -> int:
        return self.log_probs.shape[1]

    def extension_scores(self, state: DecoderState, cand_tok: torch.Tensor) -> torch.Tensor:
        """(B, K, C) fused score of each hypothesis extended by each candidate."""
        flat = state.lm_state[:, :, None] * self.vocab_size + cand_tok[:, None, :]  # (B, K, C)
        gain = self.log_probs.view(-1)[flat] * self.weight + self.unit_bonus[cand_tok][:, None, :]
        return state.lm_score[:, :, None] + gain

    def advance(self, state: DecoderState, parent: torch.Tensor, is_ext: torch.Tensor,
                token: torch.Tensor, ext_score: torch.Tensor) -> None:
        """Carry the (B, K) chosen hypotheses' LM state and score forward.

        Args:
            parent, is_ext, token: (B, K) the frame's choice (see `FrameChoice`).
            ext_score: (B, K) the chosen extension's fused score (meaningless when not one).
        """
        parent_state = state.lm_state.gather(1, parent)
        moved = self.next_state.view(-1)[parent_state * self.vocab_size + token.clamp(min=0)]
        state.lm_state = torch.where(is_ext, moved, parent_state)
        state.lm_score = torch.where(is_ext, ext_score, state.lm_score.gather(1, parent))

    def end_scores(self, lm_state: torch.Tensor) -> torch.Tensor:
        """(...) fused score of ending the sentence after each state in ``lm_state``."""
        return self.log_probs[:, self.end_id][lm_state] * self.weight
