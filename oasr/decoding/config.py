"""Decoder configuration and the hypothesis it returns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# The fusion weights a decoder uses when its config leaves them None and its LM files carry
# no tuned values (the char LM's were tuned for the bundled Whisper-CTC model).
FUSION_FALLBACKS = {"lm_weight": 1.0, "lm_unit_bonus": 2.0, "word_lm_weight": 0.5,
                    "word_oov_penalty": 2.0}


@dataclass(frozen=True)
class DecoderConfig:
    """How `GpuStreamingDecoder` searches CTC log-probs (the settings; `GpuDecoderConfig` is
    the same with the factory that builds its decoder).

    Attributes:
        beam_size: hypotheses kept per stream. 1 is greedy search (argmax, collapse repeats,
            drop blanks); above 1 is CTC prefix beam search.
        blank_id: the CTC blank's token id (0 in WeNet models).
        nbest: how many hypotheses `finalize_stream` returns; None means beam_size.
        top_k: prefix beam search only: at most this many non-blank tokens per frame may extend
            a prefix. None keeps the search exact: 2 * beam_size + 1 candidates already contain
            every extension that can enter the beam, so larger values change nothing.
            Smaller values are faster and approximate.
        min_token_log_prob: prefix beam search only: a token whose frame log-prob is below this
            never extends a prefix (e.g. -10.0). None disables the threshold.
        blank_penalty: subtracted from the blank log-prob of every frame before searching
            (and before the blank/non-blank test endpointing uses); > 0 emits more tokens.
        lm_weight: shallow fusion with a char LM given to the decoder (beam search only):
            a prefix ranks by acoustic log-prob + lm_weight * LM log-prob + bonuses. Ignored
            without an LM; 0 with zero bonuses ranks exactly like plain beam search. None
            (the default, also for the three below): the value tuned with the LM files
            (``word_lm.json``'s "fusion"), else `FUSION_FALLBACKS` (1.0, unit bonus 2.0,
            tuned for the bundled Whisper-CTC model and its char LM alone); the decoder
            resolves them (`resolved`).
        lm_unit_bonus: added per emitted unit when an LM is used (counters the LM's bias
            towards short outputs).
        lm_word_bonus: added per word boundary unit emitted when an LM is used.
        word_lm_weight: with a word LM (a lexicon unigram, `oasr.lm.word`): its word
            log-probs are scaled by this and added to the fused score, spread along each
            word's spelling by look-ahead. Ignored without a word LM.
        word_oov_penalty: with a word LM: subtracted once per word outside its lexicon (on
            top of scoring it like the rarest lexicon word). 0 with ``word_lm_weight`` 0
            ranks exactly like no word LM.
        initial_token_capacity: tokens each hypothesis buffer holds before it grows (it doubles
            when needed, so this only tunes reallocations).
        compiled_search: prefix beam search on a CPU runs the compiled search
            (`oasr.decoding.compiled_search`, the same decisions); False runs the batched
            tensor search, which CUDA always runs.
    """

    beam_size: int = 1
    blank_id: int = 0
    nbest: int | None = None
    top_k: int | None = None
    min_token_log_prob: float | None = None
    blank_penalty: float = 0.0
    lm_weight: float | None = None
    lm_unit_bonus: float | None = None
    lm_word_bonus: float = 0.0
    word_lm_weight: float | None = None
    word_oov_penalty: float | None = None
    initial_token_capacity: int = 64
    compiled_search: bool = True

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1 (1 = greedy), got {self.beam_size}")
        if self.blank_id < 0:
            raise ValueError(f"blank_id must be >= 0, got {self.blank_id}")
        if self.nbest is not None and not 1 <= self.nbest <= self.beam_size:
            raise ValueError(
                f"nbest must be in 1..beam_size={self.beam_size}, got {self.nbest}; "
                "raise beam_size or lower nbest"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None (exact), got {self.top_k}")
        if self.min_token_log_prob is not None and self.min_token_log_prob > 0.0:
            raise ValueError(
                "min_token_log_prob is a log-probability and must be <= 0, "
                f"got {self.min_token_log_prob}"
            )
        if self.blank_penalty < 0.0:
            raise ValueError(f"blank_penalty must be >= 0, got {self.blank_penalty}")
        for name in ("lm_weight", "word_lm_weight", "word_oov_penalty"):
            value = getattr(self, name)
            if value is not None and value < 0.0:
                raise ValueError(f"{name} must be >= 0 (or None: the LM's tuned value), "
                                 f"got {value}")
        for name in ("min_token_log_prob", "blank_penalty", "lm_weight", "lm_unit_bonus",
                     "lm_word_bonus", "word_lm_weight", "word_oov_penalty"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.initial_token_capacity < 1:
            raise ValueError(
                f"initial_token_capacity must be >= 1, got {self.initial_token_capacity}"
            )

    def resolved(self, tuned: Mapping[str, float] | None = None) -> DecoderConfig:
        """This config with every None fusion weight set: from ``tuned`` (an LM's tuned
        values), else `FUSION_FALLBACKS`."""
        tuned = tuned or {}
        values: dict[str, Any] = {name: tuned.get(name, fallback) for name, fallback in FUSION_FALLBACKS.items()
                  if getattr(self, name) is None}
        return replace(self, **values) if values else self

    @property
    def is_greedy(self) -> bool:
        return self.beam_size == 1

    @property
    def num_best(self) -> int:
        """Hypotheses `finalize_stream` returns."""
        return self.beam_size if self.nbest is None else self.nbest

    def runs_compiled_search(self, device_type: str) -> bool:
        """Whether a decoder on a device of this type (``"cpu"``, ``"cuda"``) runs the
        compiled prefix beam search (``compiled_search``; the tensor search otherwise)."""
        return self.compiled_search and not self.is_greedy and device_type == "cpu"

    def num_candidates(self, vocab_size: int) -> int:
        """Non-blank tokens per frame that may extend a prefix (see ``top_k``)."""
        exact = 2 * self.beam_size + 1
        limit = exact if self.top_k is None else min(self.top_k, exact)
        return max(1, min(limit, vocab_size - 1))


@dataclass(frozen=True)
class Hypothesis:
    """One decoding result.

    Attributes:
        tokens: token ids, blanks and repeats removed.
        text: the tokenizer's text for ``tokens``; "" when the decoder has no tokenizer.
        score: log-probability: for beam search the total over all alignments of the prefix
            that the search kept; for greedy search the best path's log-probability.
        timestamps: per token, the encoder frame (counted from the last reset) of the frame
            that first emitted it; ``len(timestamps) == len(tokens)``.
    """

    tokens: list[int]
    text: str
    score: float
    timestamps: list[int]
