"""Compile context codes into a dense next-state table (back-off resolved at build time)."""

from __future__ import annotations

import numpy as np


def compile_next_state(codes: np.ndarray, order: int, vocab_size: int, end_id: int) -> np.ndarray:
    """Where each (state, unit) leads: the longest kept suffix of the extended history.

    Args:
        codes: (S,) int64 context codes (see `oasr.lm.ngram`); codes[0] is the sentence
            start; the set is suffix-closed (every kept context's suffixes are kept).
        end_id: the sentence-end unit: it leads back to the sentence start, state 0.
    Returns:
        (S, V) int64 state ids.
    Raises:
        ValueError: a context whose suffix is missing (the set is not suffix-closed).
    """
    base = vocab_size + 1
    num_states = len(codes)
    sort = np.argsort(codes)
    sorted_codes = codes[sort]

    def lookup(query: np.ndarray) -> np.ndarray:
        """State ids of ``query`` codes, -1 where none."""
        pos = np.minimum(np.searchsorted(sorted_codes, query), num_states - 1)
        return np.where(sorted_codes[pos] == query, sort[pos], -1)

    lengths = _code_lengths(codes, base)
    parent = lookup(codes % base ** np.maximum(lengths - 1, 0))
    parent[lengths == 0] = -1
    if bool(((parent < 0) & (lengths > 0)).any()):
        bad = int(np.nonzero((parent < 0) & (lengths > 0))[0][0])
        raise ValueError(f"context code {int(codes[bad])} (state {bad}) has no kept suffix")
    units = np.arange(vocab_size, dtype=np.int64)
    next_state = np.zeros((num_states, vocab_size), dtype=np.int64)
    for length in range(int(lengths.max()) + 1):  # parents are shorter: filled before
        rows = np.nonzero(lengths == length)[0]
        extended = (codes[rows, None] * base + units[None, :] + 1) % base ** (order - 1)
        found = lookup(extended) if order > 1 else np.full(extended.shape, -1)
        fallback = next_state[parent[rows]] if length else np.full(found.shape, _root(codes))
        next_state[rows] = np.where(found >= 0, found, fallback)
    next_state[:, end_id] = 0
    return next_state


def _code_lengths(codes: np.ndarray, base: int) -> np.ndarray:
    """(S,) number of units in each context code."""
    lengths = np.zeros(len(codes), dtype=np.int64)
    rest = codes.copy()
    while bool((rest > 0).any()):
        lengths += rest > 0
        rest //= base
    return lengths


def _root(codes: np.ndarray) -> int:
    found = np.nonzero(codes == 0)[0]
    if len(found) != 1:
        raise ValueError("the empty context (code 0) must be a state")
    return int(found[0])
