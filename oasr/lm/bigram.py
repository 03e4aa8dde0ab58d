"""Word bigram corrections for `WordLm`: a word's score given the word before it.

Words are coded by their lexicon position plus one (code 0 = sentence start, ``W + 1`` =
outside the lexicon). A bigram model is stored as the correction it makes to the unigram,
``log P(w | v) - log P(w)``, for the (v, w) pairs seen often enough, and a back-off
correction ``log alpha(v)`` for every other pair (interpolated absolute discounting:
``P(w | v) = max(c(v, w) - d, 0) / c(v) + alpha(v) P(w)``, ``alpha(v) = d N1+(v) / c(v)``).
In the search a hypothesis carries its previous word's code (`DecoderState.prev_word`); the
correction is added when a word is closed, looked up by one ``searchsorted`` over the sorted
pair keys, so it costs the same for every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

SENTENCE_START = 0


@dataclass(frozen=True)
class WordBigrams:
    """Bigram corrections over a lexicon of W words.

    Attributes:
        prev: (N,) int64 the first word's code (0 = sentence start, 1..W).
        word: (N,) int64 the second word's code (1..W).
        log_ratio: (N,) float32 log P(word | prev) - log P(word).
        backoff: (W + 2,) float32 log alpha(v) per previous-word code (0 for the OOV code).
    """

    prev: np.ndarray
    word: np.ndarray
    log_ratio: np.ndarray
    backoff: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.prev)
        if len(self.word) != n or len(self.log_ratio) != n:
            raise ValueError(f"prev, word and log_ratio need one entry per pair, got "
                             f"{len(self.prev)}, {len(self.word)}, {len(self.log_ratio)}")

    @property
    def num_words(self) -> int:
        return len(self.backoff) - 2

    def correction(self, prev: int, word: int) -> float:
        """The correction for one (prev, word) code pair (host reference for tests)."""
        if not 1 <= word <= self.num_words:
            return 0.0
        hit = np.nonzero((self.prev == prev) & (self.word == word))[0]
        return float(self.log_ratio[hit[0]]) if len(hit) else float(self.backoff[prev])


def estimate_bigrams(sentences: Sequence[Sequence[str]], words: Sequence[str],
                     log_probs: np.ndarray, min_count: int = 2,
                     discount: float | None = None) -> WordBigrams:
    """Count word pairs of ``sentences`` (sentence start included) and store the corrections
    of pairs seen at least ``min_count`` times.

    Args:
        words, log_probs: the lexicon and its unigram (see `WordLm`).
        discount: d; None = n1 / (n1 + 2 n2) of the pair counts.
    Raises:
        ValueError: no pair of lexicon words in ``sentences``.
    """
    num_words = len(words)
    code_of = {w: i + 1 for i, w in enumerate(words)}
    oov = num_words + 1
    base = num_words + 2
    keys = []
    for sentence in sentences:
        codes = [SENTENCE_START, *(code_of.get(w, oov) for w in sentence)]
        keys += [a * base + b for a, b in zip(codes[:-1], codes[1:], strict=True) if a != oov]
    if not keys:
        raise ValueError("no word pairs to count")
    uniq, counts = np.unique(np.asarray(keys, dtype=np.int64), return_counts=True)
    prev, word = uniq // base, uniq % base
    if discount is None:
        n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
        discount = n1 / (n1 + 2 * n2) if n1 + n2 else 0.5
    context = np.bincount(prev, weights=counts, minlength=base)  # (W + 2,) c(v)
    types = np.bincount(prev, minlength=base).astype(np.float64)  # N1+(v)
    alpha = np.ones(base)
    seen = context > 0
    alpha[seen] = discount * types[seen] / context[seen]
    keep = (counts >= min_count) & (word <= num_words)
    prev, word, counts = prev[keep], word[keep], counts[keep]
    unigram = np.exp(np.asarray(log_probs, dtype=np.float64))[word - 1]
    bigram = np.maximum(counts - discount, 0.0) / context[prev] + alpha[prev] * unigram
    backoff = np.log(alpha)
    backoff[oov] = 0.0
    return WordBigrams(prev=prev, word=word,
                       log_ratio=np.log(bigram / unigram).astype(np.float32),
                       backoff=backoff.astype(np.float32))


@dataclass(frozen=True)
class BigramTables:
    """`WordBigrams` on a device with the word LM weight folded in.

    The lookup is one ``searchsorted`` over sorted pair keys. Besides the bigram pairs the keys
    hold a (v, W + 1) entry of gain 0 for every previous-word code v (closing no lexicon word
    corrects nothing) and an int64-max sentinel at the end (every key is below it), so a
    lookup needs no mask for "no word" and no clamp of the insertion index.

    Attributes:
        keys: (M,) int64 sorted keys ``prev * (W + 2) + word``.
        gains: (M,) float32 weight * log ratio of each key (0 for the added entries).
        backoff_gains: (W + 2,) float32 weight * log alpha per previous-word code.
        node_code: (S,) int64 the code of the word each trie state closes (W + 1 when none:
            the root, a prefix that is no word, the OOV state).
    """

    keys: torch.Tensor
    gains: torch.Tensor
    backoff_gains: torch.Tensor
    node_code: torch.Tensor

    @classmethod
    def build(cls, bigrams: WordBigrams, node_code: np.ndarray, weight: float,
              device: torch.device | str) -> BigramTables:
        base = bigrams.num_words + 2
        keys = bigrams.prev.astype(np.int64) * base + bigrams.word.astype(np.int64)
        no_word = np.arange(base, dtype=np.int64) * base + (base - 1)  # (v, W + 1)
        keys = np.concatenate([keys, no_word, [np.iinfo(np.int64).max]])
        ratios = np.concatenate([bigrams.log_ratio.astype(np.float64),
                                 np.zeros(len(no_word) + 1)])
        order = np.argsort(keys, kind="stable")
        return cls(keys=torch.from_numpy(keys[order]).to(device),
                   gains=torch.from_numpy(weight * ratios[order]).float().to(device),
                   backoff_gains=torch.from_numpy(weight * bigrams.backoff).float().to(device),
                   node_code=torch.from_numpy(node_code).to(device))

    @property
    def oov_code(self) -> int:
        return self.backoff_gains.shape[0] - 1

    def closing_gains(self, prev_word: torch.Tensor, word_state: torch.Tensor) -> torch.Tensor:
        """(...) the correction for closing each state's word after ``prev_word`` (same shape:
        previous-word codes and trie states); 0 where no lexicon word is closed."""
        code = torch.take(self.node_code, word_state)  # (...)
        key = prev_word * (self.oov_code + 1) + code  # prev * (W + 2) + code
        index = torch.searchsorted(self.keys, key)  # < len(keys): the sentinel is above all
        found = torch.take(self.keys, index) == key
        return torch.where(found, torch.take(self.gains, index),
                           torch.take(self.backoff_gains, prev_word))
