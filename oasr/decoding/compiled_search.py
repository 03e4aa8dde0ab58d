"""CTC prefix beam search compiled for the CPU: `oasr.decoding.search.beam_chunk`'s search,
one stream at a time in machine code (numba) instead of batched tensor operations.

The tensor search spends a CPU step on dispatch, not arithmetic: each frame is about 45
small operations, each a pass over (B, K, C) memory. Here one stream's frame is a few loops
over its K hypotheses and C candidates whose data stay in the cache, and the streams of a
batch are split over worker threads (the compiled code runs without the GIL).

It is the same search: the same candidates, the same scores added in the same order, the
same LM, word-LM, bigram and hotword lookups as `LmFusion` and `ContextBatch`. Two things may
differ, both only between hypotheses whose scores are equal or a rounding apart: the
compiled ranking gives a tie to the earlier entry (a stay before an extension, then by
hypothesis and candidate) where ``torch.topk`` leaves the order of ties to its kernel; and a
``logaddexp`` may differ in its last bit (the vector units' ``exp`` is not the C library's).
Candidates that cannot enter the beam are not scored at all (see `_search_rows`), which
changes nothing. The tensor search stays the reference and the search on CUDA
(``DecoderConfig.compiled_search``).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch

from oasr.decoding.beam_tables import ChunkFrames
from oasr.decoding.config import DecoderConfig
from oasr.decoding.context import ContextBatch
from oasr.decoding.lm_fusion import LmFusion
from oasr.decoding.search import INT_FIELDS, NO_PARENT_KEY, point_ints
from oasr.decoding.state import HASH_MULTIPLIER, DecoderState

# Rows a thread searches at a time when a batch is split over threads.
ROWS_PER_PIECE = 16
# The search's range in torch.profiler's record (it is no torch op).
PROFILE_NAME = "oasr::compiled_ctc_beam_search"

_F32_NEG_INF = np.float32(-np.inf)


def jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit`` running without the GIL, its machine code cached on disk where numba
    finds a writable place for it (beside this file, ``NUMBA_CACHE_DIR``, the user's cache);
    where there is none, compiled in every process instead of failing the import."""
    def wrap(func: Callable[..., Any]) -> Any:
        try:
            return numba.njit(nogil=True, cache=True, **options)(func)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, **options)(func)
    return wrap


@dataclass(frozen=True)
class SearchTables:
    """`LmFusion`'s tables as host arrays in the dtypes the compiled search takes; one-entry
    placeholders for the parts a decoder lacks (``use_*`` say which are real).

    Attributes:
        gains, next_state: the char LM (S, V) float32 and int64 (`LmFusion.gains`).
        word_gains, word_next, closers: the word LM (S', V) float32, (S', V) int32, (V,) bool.
        bigram_keys, bigram_gains, backoff_gains, node_code: its bigram lookup
            (`oasr.lm.bigram.BigramTables`).
        gains_max, word_max: (S,) and (S',) float32 the largest entry of each row of
            ``gains`` and ``word_gains``: the most a unit can add after that state.
    """

    use_lm: bool
    gains: np.ndarray
    next_state: np.ndarray
    use_word: bool
    word_gains: np.ndarray
    word_next: np.ndarray
    closers: np.ndarray
    use_bigram: bool
    bigram_keys: np.ndarray
    bigram_gains: np.ndarray
    backoff_gains: np.ndarray
    node_code: np.ndarray
    gains_max: np.ndarray
    word_max: np.ndarray

    @classmethod
    def build(cls, fusion: LmFusion | None) -> SearchTables:
        def host(t: torch.Tensor | None, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
            if t is None:
                return np.zeros(shape, dtype=dtype)
            return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=dtype)

        word = fusion.word if fusion is not None else None
        bigram = word.bigram if word is not None else None
        return cls(
            use_lm=fusion is not None,
            gains=host(fusion.gains if fusion else None, np.float32, (1, 1)),
            next_state=host(fusion.next_state if fusion else None, np.int64, (1, 1)),
            use_word=word is not None,
            word_gains=host(word.gains if word else None, np.float32, (1, 1)),
            word_next=host(word.next_state if word else None, np.int32, (1, 1)),
            closers=host(word.closers if word else None, np.bool_, (1,)),
            use_bigram=bigram is not None,
            bigram_keys=host(bigram.keys if bigram else None, np.int64, (1,)),
            bigram_gains=host(bigram.gains if bigram else None, np.float32, (1,)),
            backoff_gains=host(bigram.backoff_gains if bigram else None, np.float32, (1,)),
            node_code=host(bigram.node_code if bigram else None, np.int64, (1,)),
            gains_max=host(fusion.gains.amax(dim=1) if fusion else None, np.float32, (1,)),
            word_max=host(word.gains.amax(dim=1) if word else None, np.float32, (1,)),
        )


@jit(inline="always")
def _logaddexp(a: np.float32, b: np.float32) -> np.float32:
    """``torch.logaddexp`` of two float32s; the -inf cases return what its formula gives,
    without the ``exp`` and ``log1p``."""
    if b == -np.inf:
        return a
    if a == -np.inf or (a == b and math.isinf(a)):
        return b
    return max(a, b) + np.log1p(np.exp(-abs(a - b)))


@jit(inline="always")
def _offer(best_score: np.ndarray, best_index: np.ndarray, count: int, score: np.float32,
           entry: int) -> int:
    """Put ``entry`` into the descending top list (``count`` filled of its k) when it beats
    the last one, after the entries of equal score; returns the new count."""
    k = best_score.shape[0]
    if count == k and not score > best_score[k - 1]:
        return count
    at = count if count < k else k - 1
    while at > 0 and score > best_score[at - 1]:
        best_score[at] = best_score[at - 1]
        best_index[at] = best_index[at - 1]
        at -= 1
    best_score[at] = score
    best_index[at] = entry
    return count + 1 if count < k else count


@jit()
def _closing_gain(keys: np.ndarray, gains: np.ndarray, backoff: np.ndarray, node_code: np.ndarray,
                  prev_word: int, word_state: int) -> np.float32:
    """`BigramTables.closing_gains` of one hypothesis: a binary search of the sorted keys."""
    key = prev_word * backoff.shape[0] + node_code[word_state]
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return gains[lo] if keys[lo] == key else backoff[prev_word]


@jit()
def _search_rows(row_start, row_stop, log_probs, top_lp, top_tok, valid, frame_index,
                 blank, num_cand, min_lp, floats, ints, tokens, token_frames,
                 out_floats, out_ints, out_tokens, out_frames, fused,
                 use_lm, gains, next_state, use_word, word_gains, word_next, closers,
                 use_bigram, bigram_keys, bigram_gains, backoff_gains, node_code,
                 use_ctx, class_of, ctx_goto, ctx_gains, class_base, ctx_base, ctx_width,
                 gains_max, word_max, ctx_bound):
    """Search rows ``row_start:row_stop`` of one chunk (arguments: `beam_chunk_compiled`).

    The most the LMs can add to a hypothesis's fused score with one unit is known from its
    states (``gains_max``, ``word_max``, its bigram correction) and ``ctx_bound`` (the largest
    hotword gain); its candidates come most likely first, so once one cannot pass the k-th
    best score with that bound, none after it can, and the rest are not scored.

    Dead hypotheses (-inf) and -inf extensions are never ranked: when fewer than K entries
    are finite, the rest of the beam is filled with dead copies of hypotheses that were not
    chosen (the tensor search fills it with -inf entries in its own order; neither is ever
    read as a prefix).
    """
    num_frames = log_probs.shape[1]
    k = floats.shape[2]
    width = top_tok.shape[2]
    neg_inf = np.float32(-np.inf)
    # the hypotheses' fields, updated frame by frame (copies of the row's, then the next's)
    pb = np.empty(k, np.float32)
    pnb = np.empty(k, np.float32)
    lm = np.empty(k, np.float32)
    fields = np.empty((7, k), np.int64)
    closing = np.empty(k, np.float32)  # the bigram correction of closing its word, cached
    closing_known = np.empty(k, np.bool_)
    total = np.empty(k, np.float32)  # logaddexp(pb, pnb), carried from frame to frame
    stay_total = np.empty(k, np.float32)
    lp_last = np.empty(k, np.float32)
    stay_pb = np.empty(k, np.float32)
    stay_pnb = np.empty(k, np.float32)
    parent_key = np.empty(k, np.int64)
    children = np.empty((k, k), np.int64)  # each hypothesis's children's last tokens
    num_children = np.empty(k, np.int64)
    cand_tok = np.empty(width, np.int64)
    cand_lp = np.empty(width, np.float32)
    ext = np.empty((k, width), np.float32)
    lm_ext = np.empty((k, width), np.float32)
    ctx_next = np.zeros((k, width), np.int64)
    best_score = np.empty(k, np.float32)
    best_index = np.empty(k, np.int64)
    chosen = np.empty(k, np.bool_)
    new_pb = np.empty(k, np.float32)
    new_pnb = np.empty(k, np.float32)
    new_lm = np.empty(k, np.float32)
    new_total = np.empty(k, np.float32)
    new_fields = np.empty((7, k), np.int64)
    new_closing = np.empty(k, np.float32)
    new_known = np.empty(k, np.bool_)
    # each frame's choice, for the backtrace of the token buffers at the chunk's end
    parents = np.empty((num_frames, k), np.int64)
    extends = np.empty((num_frames, k), np.bool_)
    added = np.empty((num_frames, k), np.int64)
    frame_at = np.empty(num_frames, np.int64)
    for b in range(row_start, row_stop):
        for h in range(k):
            pb[h] = floats[b, 0, h]
            pnb[h] = floats[b, 1, h]
            lm[h] = floats[b, 2, h]
            total[h] = _logaddexp(pb[h], pnb[h])
            closing_known[h] = False
        fields[:, :] = ints[b]
        length, last, phash = fields[0], fields[1], fields[2]
        lm_state, word_state, prev_word, ctx_state = fields[3], fields[4], fields[5], fields[6]
        steps = 0
        for t in range(num_frames):
            if not valid[b, t]:
                continue
            # the frame's candidates: its best num_cand non-blank tokens (above min_lp)
            nc = 0
            seen = 0
            for j in range(width):
                tok = top_tok[b, t, j]
                if tok == blank:
                    continue
                seen += 1
                if seen > num_cand:
                    break
                if top_lp[b, t, j] >= min_lp:
                    cand_tok[nc] = tok
                    cand_lp[nc] = top_lp[b, t, j]
                    nc += 1
            lp_blank = log_probs[b, t, blank]
            for h in range(k):
                lp_last[h] = log_probs[b, t, last[h]] if last[h] >= 0 else np.float32(0.0)
                stay_pb[h] = total[h] + lp_blank
                stay_pnb[h] = pnb[h] + lp_last[h]
                # a dead hypothesis gets the tensor search's key of no parent
                parent_key[h] = phash[h] * HASH_MULTIPLIER if total[h] != neg_inf else NO_PARENT_KEY
            # a hypothesis that is another's prefix + one token takes that extension's paths
            num_children[:] = 0
            for c in range(k):
                if total[c] == neg_inf or last[c] < 0:
                    continue
                key = phash[c] - (last[c] + 1)
                p = -1
                for q in range(k):  # at most one matches (live prefixes are distinct)
                    p = q if parent_key[q] == key else p
                if p >= 0 and key != NO_PARENT_KEY:
                    via = pb[p] if last[p] == last[c] else total[p]
                    stay_pnb[c] = _logaddexp(stay_pnb[c], via + lp_last[c])
                    children[p, num_children[p]] = last[c]  # p + last[c] is c: not an extension
                    num_children[p] += 1
            # the k best of the stays and the extensions, ties to the earlier (stays first,
            # then by hypothesis and candidate); LM and hotword scores rank, stored stay acoustic
            count = 0
            for h in range(k):
                if total[h] == neg_inf:
                    continue
                s = stay_total[h] = _logaddexp(stay_pb[h], stay_pnb[h])
                count = _offer(best_score, best_index, count, s + lm[h] if fused else s, h)
            for h in range(k):
                if total[h] == neg_inf:
                    continue
                if fused and use_bigram and not closing_known[h]:
                    closing[h] = _closing_gain(bigram_keys, bigram_gains, backoff_gains,
                                               node_code, prev_word[h], word_state[h])
                    closing_known[h] = True
                row = ctx_base[b] + ctx_state[h] * ctx_width[b] if use_ctx else 0
                reach = np.float64(total[h])
                if fused:
                    reach += lm[h] + ctx_bound
                    if use_lm:
                        reach += gains_max[lm_state[h]]
                        if use_word:
                            reach += word_max[word_state[h]]
                            if use_bigram:
                                reach += max(closing[h], np.float32(0.0))
                reach += 1e-3 + 1e-4 * abs(reach)  # more than the float32 sums' rounding
                for j in range(nc):
                    if count == k and reach + cand_lp[j] <= best_score[k - 1]:
                        break  # neither this candidate nor a later (less likely) one can enter
                    tok = cand_tok[j]
                    is_child = False
                    for n in range(num_children[h]):
                        is_child = is_child or children[h, n] == tok
                    if is_child:
                        continue
                    # a repeated token extends only the blank-ending paths
                    s = (pb[h] if tok == last[h] else total[h]) + cand_lp[j]
                    if s == neg_inf:
                        continue
                    ext[h, j] = s
                    if fused:
                        if use_lm:
                            g = gains[lm_state[h], tok] + lm[h]
                            if use_word:
                                g = g + word_gains[word_state[h], tok]
                                if use_bigram and closers[tok]:
                                    g = g + closing[h]
                        else:
                            g = lm[h]
                        if use_ctx:
                            at = row + class_of[class_base[b] + tok]
                            g = g + ctx_gains[at]
                            ctx_next[h, j] = ctx_goto[at]
                        lm_ext[h, j] = g
                        s = s + g
                    if count < k or s > best_score[k - 1]:
                        count = _offer(best_score, best_index, count, s, k + h * nc + j)
            chosen[:] = False
            for i in range(count):
                if best_index[i] < k:
                    chosen[best_index[i]] = True
            filler = 0
            for i in range(k):
                e = best_index[i] if i < count else -1
                if e < k:  # hypothesis p stays: a ranked stay, or a dead copy filling the beam
                    if e >= 0:
                        p = e
                        new_pb[i], new_pnb[i] = stay_pb[p], stay_pnb[p]
                        new_total[i] = stay_total[p]
                    else:  # of a hypothesis no stay kept
                        while chosen[filler]:
                            filler += 1
                        p = filler
                        filler += 1
                        new_pb[i], new_pnb[i], new_total[i] = neg_inf, neg_inf, neg_inf
                    parents[steps, i], extends[steps, i], added[steps, i] = p, False, -1
                    new_lm[i] = lm[p] if fused else lm[i]
                    new_closing[i], new_known[i] = closing[p], closing_known[p]
                    new_fields[:, i] = fields[:, p]
                    continue
                p, j = (e - k) // nc, (e - k) % nc
                tok = cand_tok[j]
                parents[steps, i], extends[steps, i], added[steps, i] = p, True, tok
                new_pb[i], new_pnb[i] = neg_inf, ext[p, j]
                new_total[i] = ext[p, j]  # logaddexp(-inf, x) is x
                new_lm[i] = lm_ext[p, j] if fused else lm[i]
                new_known[i] = False
                new_fields[0, i] = length[p] + 1
                new_fields[1, i] = tok
                new_fields[2, i] = phash[p] * HASH_MULTIPLIER + (tok + 1)
                new_fields[3, i] = next_state[lm_state[p], tok] if use_lm else lm_state[p]
                new_fields[4, i] = word_next[word_state[p], tok] if use_word else word_state[p]
                closes = use_bigram and closers[tok] and word_state[p] != 0
                new_fields[5, i] = node_code[word_state[p]] if closes else prev_word[p]
                new_fields[6, i] = ctx_next[p, j] if use_ctx else ctx_state[p]
            pb[:] = new_pb
            pnb[:] = new_pnb
            lm[:] = new_lm
            total[:] = new_total
            closing[:] = new_closing
            closing_known[:] = new_known
            fields[:, :] = new_fields
            frame_at[steps] = frame_index[b, t]
            steps += 1
        out_floats[b, 0], out_floats[b, 1], out_floats[b, 2] = pb, pnb, lm
        out_ints[b] = fields
        _backtrace(b, steps, parents, extends, added, frame_at, length, tokens, token_frames,
                   out_tokens, out_frames)


@jit()
def _backtrace(b, steps, parents, extends, added, frame_at, length, tokens, token_frames,
               out_tokens, out_frames):
    """Row ``b``'s token buffers after its ``steps`` searched frames: each hypothesis's
    ancestor's prefix before the chunk, then the tokens its line of choices appended (the
    columns past the prefix are left as they are: nothing reads them)."""
    capacity = tokens.shape[2]
    for h in range(parents.shape[1]):
        ancestor = h
        for s in range(steps - 1, -1, -1):
            ancestor = parents[s, ancestor]
        end = length[h]
        at = h
        for s in range(steps - 1, -1, -1):
            if extends[s, at]:
                end -= 1
                if end < capacity:
                    out_tokens[b, h, end] = added[s, at]
                    out_frames[b, h, end] = frame_at[s]
            at = parents[s, at]
        out_tokens[b, h, :end] = tokens[b, ancestor, :end]
        out_frames[b, h, :end] = token_frames[b, ancestor, :end]


_compiled = threading.Event()


def ensure_compiled() -> None:
    """Compile the search now (or load it from numba's cache beside this file: about 0.3 s;
    compiling takes several seconds), not in the first live step: a one-row search of the
    argument types every search uses. Decoders that use the search call it once built."""
    if _compiled.is_set():
        return
    from oasr.decoding.search import prepare_chunk
    from oasr.decoding.state import new_state

    config = DecoderConfig(beam_size=2)
    state = new_state(1, 2, 4, 0, torch.device("cpu"))
    log_probs = torch.log_softmax(torch.zeros((1, 1, 3)), dim=-1)
    beam_chunk_compiled(prepare_chunk(log_probs, None, state, config), state, config,
                        SearchTables.build(None))
    _compiled.set()


_pool: tuple[int, ThreadPoolExecutor] | None = None  # (its width, the pool)
_pool_lock = threading.Lock()


def _workers(num: int) -> ThreadPoolExecutor:
    """A pool of at least ``num`` threads, shared by every decoder of the process."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] < num:
            _pool = (num, ThreadPoolExecutor(max_workers=num, thread_name_prefix="oasr-search"))
        return _pool[1]


def beam_chunk_compiled(chunk: ChunkFrames, state: DecoderState, config: DecoderConfig,
                        tables: SearchTables, context: ContextBatch | None = None) -> None:
    """`oasr.decoding.search.beam_chunk` on a CPU state, compiled; the rows are split over
    torch's intra-op threads.

    Args:
        tables: the decoder's `LmFusion` as `SearchTables` (built once per decoder).
        context: the rows' hotword graphs.
    """
    assert chunk.top_log_probs is not None and chunk.top_tokens is not None
    batch, num_frames, vocab = chunk.log_probs.shape
    floats = torch.stack([state.log_pb, state.log_pnb, state.lm_score], dim=1).numpy()
    ints = torch.stack([getattr(state, name) for name in INT_FIELDS], dim=1).numpy()
    tokens, frames = state.tokens.contiguous().numpy(), state.token_frames.contiguous().numpy()
    out_floats, out_ints = np.empty_like(floats), np.empty_like(ints)
    out_tokens, out_frames = np.empty_like(tokens), np.empty_like(frames)
    min_lp = config.min_token_log_prob
    ctx = _context_arrays(context)
    args = (
        chunk.log_probs.contiguous().numpy(), chunk.top_log_probs.contiguous().numpy(),
        chunk.top_tokens.contiguous().numpy(), chunk.valid.contiguous().numpy(),
        chunk.frame_index.contiguous().numpy(), config.blank_id,
        config.num_candidates(vocab), _F32_NEG_INF if min_lp is None else np.float32(min_lp),
        floats, ints, tokens, frames, out_floats, out_ints, out_tokens, out_frames,
        tables.use_lm or context is not None,
        tables.use_lm, tables.gains, tables.next_state, tables.use_word, tables.word_gains,
        tables.word_next, tables.closers, tables.use_bigram, tables.bigram_keys,
        tables.bigram_gains, tables.backoff_gains, tables.node_code, context is not None, *ctx,
        tables.gains_max, tables.word_max,
        max(0.0, float(ctx[2].max())) if context is not None else 0.0,
    )
    # a named range, so profiles of a step (`oasr bench`'s op shares) count the search's time
    with torch.profiler.record_function(PROFILE_NAME):
        _run_rows(batch, torch.get_num_threads(), args)
    state.log_pb, state.log_pnb, state.lm_score = torch.from_numpy(out_floats).unbind(1)
    point_ints(state, torch.from_numpy(out_ints))
    state.tokens, state.token_frames = torch.from_numpy(out_tokens), torch.from_numpy(out_frames)


def _run_rows(batch: int, threads: int, args: tuple) -> None:
    """`_search_rows` over rows ``0:batch``: in this thread, or in pieces of `ROWS_PER_PIECE`
    that this thread and ``threads - 1`` workers take in turn (rows differ in cost, so a
    fixed split would leave one thread waiting for another)."""
    if threads < 2 or batch < 2 * ROWS_PER_PIECE:
        _search_rows(0, batch, *args)
        return
    pieces = itertools.count()
    num_pieces = -(-batch // ROWS_PER_PIECE)

    def take_pieces() -> None:
        for piece in pieces:  # next() of a count is atomic under the GIL
            if piece >= num_pieces:
                return
            start = piece * ROWS_PER_PIECE
            _search_rows(start, min(batch, start + ROWS_PER_PIECE), *args)

    helpers = [_workers(threads - 1).submit(take_pieces) for _ in range(threads - 1)]
    take_pieces()
    for helper in helpers:
        helper.result()


_NO_CONTEXT = (np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.float32),
               np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))


def _context_arrays(context: ContextBatch | None) -> tuple[np.ndarray, ...]:
    if context is None:
        return _NO_CONTEXT
    return (
        context.class_of.numpy().astype(np.int64, copy=False),
        context.goto.numpy().astype(np.int64, copy=False),
        context.gains.numpy().astype(np.float32, copy=False),
        context.class_base.numpy(), context.base.numpy(), context.width.numpy(),
    )
