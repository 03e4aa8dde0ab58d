"""Shallow fusion of a char n-gram LM and a word lexicon LM into CTC prefix beam search.

A hypothesis's LM history is two automaton state ids (`DecoderState.lm_state` for the char
n-gram, `DecoderState.word_state` for the word lexicon trie, plus `DecoderState.prev_word`
for a word bigram), so the LM score of every
candidate extension of every hypothesis of every stream is one gather from each LM's dense
(S, V) gain table. The stored CTC scores stay acoustic; the fused score of a prefix is carried
beside them (`DecoderState.lm_score`) and only the ranking adds the two. Merging two
alignments of the same prefix keeps one LM score: the LM score is a function of the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from oasr.decoding.config import DecoderConfig
from oasr.decoding.state import DecoderState

if TYPE_CHECKING:
    from oasr.lm import DecoderLm, WordGains


@dataclass(frozen=True)
class LmFusion:
    """The LM tables on the decoder's device and the fusion weights.

    Attributes:
        gains: (S, V) float32 what emitting each unit after each char state adds to a prefix's
            fused score: lm_weight * LM log-prob + lm_unit_bonus (+ lm_word_bonus on the word
            boundary), folded into one table so scoring a candidate is one gather. Without a
            char LM, one state carrying only the bonuses.
        next_state: (S, V) int64 the char state after each unit.
        end_gains: (S,) float32 lm_weight * LM log-prob of the sentence end after each state
            (scored when a hypothesis is finalised).
        word: the word LM's tables (weight and OOV penalty folded in; see `oasr.lm.word`),
            None without a word LM.
        closer_ids: (n,) int64 the units that close a word (``word.closers``' ids) when the
            word LM has bigrams: their extensions get the bigram correction. None otherwise.
    """

    gains: torch.Tensor
    next_state: torch.Tensor
    end_gains: torch.Tensor
    word: WordGains | None = None
    closer_ids: torch.Tensor | None = None

    @classmethod
    def build(cls, both: DecoderLm, config: DecoderConfig, device: torch.device,
              boundary_id: int | None) -> LmFusion:
        """Tables of ``both`` on ``device`` with ``config``'s weights (a config already
        `DecoderConfig.resolved` against ``both.fusion_defaults``, as the decoder holds)."""
        assert config.lm_weight is not None and config.lm_unit_bonus is not None
        assert config.word_lm_weight is not None and config.word_oov_penalty is not None
        vocab = len(both.units)
        bonus = torch.full((vocab,), config.lm_unit_bonus, device=device)
        if boundary_id is not None:
            bonus[boundary_id] += config.lm_word_bonus
        if both.char is not None:
            char = both.char.to(device)
            weighted = char.log_probs * config.lm_weight  # (S, V)
            gains, next_state = weighted + bonus, char.next_state
            end_gains = weighted[:, char.header.end_id].contiguous()
        else:
            gains = bonus[None, :].clone()  # (1, V)
            next_state = torch.zeros((1, vocab), dtype=torch.int64, device=device)
            end_gains = torch.zeros(1, device=device)
        word = closer_ids = None
        if both.word is not None:
            word = both.word.gains_for(config.word_lm_weight, config.word_oov_penalty, device)
            if word.bigram is not None:
                closer_ids = torch.nonzero(word.closers).flatten()  # once, at build time
        return cls(gains=gains, next_state=next_state, end_gains=end_gains, word=word,
                   closer_ids=closer_ids)

    @property
    def vocab_size(self) -> int:
        return self.gains.shape[1]

    def extension_scores(self, state: DecoderState, cand_tok: torch.Tensor,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """(B, K, C) fused score of each hypothesis extended by each candidate ``cand_tok``
        (B, C) (written to ``out`` when given).

        Every hypothesis's table rows are summed over the whole vocabulary first (the same
        additions, in the same order, as per candidate), the word-closing units' columns get
        the bigram correction, and one gather picks the candidates.
        """
        batch, k = state.lm_state.shape
        rows = torch.nn.functional.embedding(state.lm_state, self.gains)  # (B, K, V)
        rows.add_(state.lm_score.unsqueeze(2))
        word = self.word
        if word is not None:
            rows.add_(torch.nn.functional.embedding(state.word_state, word.gains))
            if word.bigram is not None:
                assert self.closer_ids is not None
                closing = word.bigram.closing_gains(state.prev_word, state.word_state)  # (B, K)
                closers = closing.unsqueeze(2).expand(batch, k, self.closer_ids.shape[0])
                rows.index_add_(2, self.closer_ids, closers)
        pick = cand_tok.unsqueeze(1).expand(batch, k, cand_tok.shape[1])  # (B, K, C)
        return torch.gather(rows, 2, pick, out=out) if out is not None else rows.gather(2, pick)

    def extended_states(self, lm_state: torch.Tensor, word_state: torch.Tensor,
                        prev_word: torch.Tensor, token: torch.Tensor) -> list[torch.Tensor]:
        """The LM states of prefixes in states (``lm_state``, ``word_state``, ``prev_word``)
        extended by ``token`` (all (...) int64, same shape): [char state, word state, previous
        word] after the token."""
        flat = lm_state * self.vocab_size + token
        moved = [torch.take(self.next_state, flat), word_state, prev_word]
        word = self.word
        if word is not None:
            flat_w = word_state * self.vocab_size + token
            moved[1] = torch.take(word.next_state, flat_w).long()
            if word.bigram is not None:  # a closed word becomes the previous word
                closes = torch.take(word.closers, token) & (word_state != 0)
                moved[2] = torch.where(closes, torch.take(word.bigram.node_code, word_state),
                                       prev_word)
        return moved

    def end_scores(self, lm_state: torch.Tensor, word_state: torch.Tensor,
                   prev_word: torch.Tensor) -> torch.Tensor:
        """(...) fused score of ending the sentence after each (char state, word state,
        previous word) triple."""
        scores = self.end_gains[lm_state]
        if self.word is not None:
            scores = scores + self.word.end_gains[word_state]
            if self.word.bigram is not None:
                scores = scores + self.word.bigram.closing_gains(prev_word, word_state)
        return scores
