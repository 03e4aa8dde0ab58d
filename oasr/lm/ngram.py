"""Counting and smoothing a character n-gram model into dense per-context distributions.

A context (history) of up to ``order - 1`` units is identified by an integer code: with base
``B = V + 1`` and units shifted by one, ``code(h) = sum((h[j] + 1) * B ** (m - 1 - j))`` for a
context of length m (the most recent unit is the least significant digit). Shifted digits are
never 0, so contexts of different lengths never share a code; appending a unit is
``code * B + unit + 1``, the last L units are ``code % B ** L``.

Sentences are ``<sos> c1 .. cn <eos>`` where ``<sos>`` and ``<eos>`` are the same unit (the
``<sos/eos>`` unit of the model): as a context digit it means sentence start, as a predicted
unit sentence end. After an end the history is the sentence start again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

SMOOTHINGS = ("kneser_ney", "witten_bell")


@dataclass(frozen=True)
class NgramCounts:
    """Raw n-gram counts of a corpus.

    Attributes:
        order: highest n-gram order N.
        vocab_size: V, units of the model.
        sos_id: the sentence start / end unit.
        grams: per order n = 1..N (index n - 1), the sorted unique codes of the n-grams
            seen (n-gram = context of n - 1 units + predicted unit, coded like a context).
        counts: per order, (num_grams,) int64 occurrences of each.
    """

    order: int
    vocab_size: int
    sos_id: int
    grams: list[np.ndarray]
    counts: list[np.ndarray]

    @property
    def base(self) -> int:
        return self.vocab_size + 1


def count_ngrams(sentences: Iterable[Sequence[int]], order: int, vocab_size: int,
                 sos_id: int) -> NgramCounts:
    """Count every n-gram of order 1..``order`` of ``<sos> sentence <eos>``.

    Args:
        sentences: unit id sequences (no sos / eos; ids in 0..V-1).
    Raises:
        ValueError: an order below 1, or one whose codes overflow int64.
    """
    base = vocab_size + 1
    if order < 1 or base ** order >= 2**62:
        raise ValueError(f"order must be in 1..{int(np.log(2**62) / np.log(base))}, got {order}")
    seqs = [np.asarray([sos_id, *s, sos_id], dtype=np.int64) + 1 for s in sentences]
    if not seqs:
        raise ValueError("no sentences to count")
    flat = np.concatenate(seqs)  # (N_units,) shifted ids
    starts = np.cumsum([0] + [len(s) for s in seqs[:-1]])
    sent_pos = np.arange(len(flat)) - np.repeat(starts, [len(s) for s in seqs])
    grams, counts = [], []
    for n in range(1, order + 1):
        # an n-gram ends at position i >= n - 1 of its sentence, never at the <sos> (pos 0)
        end = np.nonzero((sent_pos >= n - 1) & (sent_pos >= 1))[0]
        code = np.zeros(len(end), dtype=np.int64)
        for j in range(n - 1, -1, -1):
            code = code * base + flat[end - j]
        uniq, cnt = np.unique(code, return_counts=True)
        grams.append(uniq)
        counts.append(cnt.astype(np.int64))
    return NgramCounts(order, vocab_size, sos_id, grams, counts)


@dataclass(frozen=True)
class DenseModel:
    """Smoothed distributions of every kept context, back-off resolved.

    Attributes:
        codes: (S,) int64 context codes; codes[0] is the sentence-start context.
        probs: (S, V) float64, each row a distribution over the units.
    """

    codes: np.ndarray
    probs: np.ndarray


def emittable_mask(vocab_size: int, blank_id: int) -> np.ndarray:
    """(V,) bool: the units a sentence can contain or end with (all but the blank)."""
    mask = np.ones(vocab_size, dtype=bool)
    mask[blank_id] = False
    return mask


def smooth(counts: NgramCounts, smoothing: str, blank_id: int,
           min_context_count: Sequence[int]) -> DenseModel:
    """Interpolated Kneser-Ney (one discount per order) or Witten-Bell distributions.

    Args:
        min_context_count: per context length m = 0..N-1, the fewest occurrences a context
            needs to keep its own distribution (pruned ones use their longest kept suffix's).
    Raises:
        ValueError: unknown smoothing, or a threshold list of the wrong length.
    """
    if smoothing not in SMOOTHINGS:
        raise ValueError(f"smoothing must be one of {SMOOTHINGS}, got {smoothing!r}")
    if len(min_context_count) != counts.order:
        raise ValueError(f"min_context_count needs {counts.order} values (context lengths "
                         f"0..{counts.order - 1}), got {len(min_context_count)}")
    v, base = counts.vocab_size, counts.base
    mask = emittable_mask(v, blank_id)
    lower = np.where(mask, 1.0 / mask.sum(), 0.0)[None, :]  # (1, V): below the unigrams
    lower_codes = np.zeros(1, dtype=np.int64)
    all_codes, all_probs = [], []
    for n in range(1, counts.order + 1):
        grams = counts.grams[n - 1]
        if smoothing == "kneser_ney" and n < counts.order:
            adjusted = _continuation_counts(counts, n)
        else:
            adjusted = counts.counts[n - 1]
        ctx, unit = grams // base, grams % base - 1
        uniq, inverse = np.unique(ctx, return_inverse=True)
        table = np.zeros((len(uniq), v))
        np.add.at(table, (inverse, unit), adjusted)
        raw = np.zeros(len(uniq), dtype=np.int64)
        np.add.at(raw, inverse, counts.counts[n - 1])
        keep = raw >= min_context_count[n - 1]
        uniq, table = uniq[keep], table[keep]
        parent = np.searchsorted(lower_codes, uniq % base ** (n - 2) if n > 1 else 0)
        assert n == 1 or np.array_equal(lower_codes[parent], uniq % base ** (n - 2)), \
            "a kept context's suffix was pruned"
        probs = _interpolate(table, lower[parent], smoothing, _discount(counts, n, adjusted))
        all_codes.append(uniq)
        all_probs.append(probs)
        lower_codes, lower = uniq, probs
    codes, probs = np.concatenate(all_codes), np.concatenate(all_probs)
    start = np.nonzero(codes == counts.sos_id + 1)[0]
    assert len(start) == 1, "the sentence-start context must be kept"
    order = np.concatenate([start, np.delete(np.arange(len(codes)), start)])
    return DenseModel(codes=codes[order], probs=probs[order])


def _continuation_counts(counts: NgramCounts, n: int) -> np.ndarray:
    """Kneser-Ney counts of the n-grams of order n < N: distinct units seen before each,
    except for n-grams that start at a sentence start (nothing can precede them)."""
    base = counts.base
    longer = counts.grams[n]  # (n+1)-grams; dropping the first unit gives the n-gram
    suffix = longer % base ** n
    uniq, cont = np.unique(suffix, return_counts=True)
    grams = counts.grams[n - 1]
    adjusted = np.zeros(len(grams), dtype=np.int64)
    adjusted[np.searchsorted(grams, uniq)] = cont
    first = grams // base ** (n - 1)  # the first (shifted) unit of each n-gram
    starts_sentence = first == counts.sos_id + 1
    if n > 1:
        adjusted[starts_sentence] = counts.counts[n - 1][starts_sentence]
    return adjusted


def _discount(counts: NgramCounts, n: int, adjusted: np.ndarray) -> float:
    """Kneser-Ney discount of order n: n1 / (n1 + 2 n2) over its (adjusted) counts."""
    n1, n2 = int((adjusted == 1).sum()), int((adjusted == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 + n2 > 0 else 0.5


def _interpolate(table: np.ndarray, lower: np.ndarray, smoothing: str,
                 discount: float) -> np.ndarray:
    """(S, V) counts of S contexts + (S, V) their suffix's distribution -> (S, V) probs."""
    total = table.sum(axis=1, keepdims=True)  # (S, 1)
    types = (table > 0).sum(axis=1, keepdims=True)  # (S, 1)
    if smoothing == "witten_bell":
        return (table + types * lower) / (total + types)
    return (np.maximum(table - discount, 0.0) + discount * types * lower) / total
