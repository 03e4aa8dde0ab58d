"""Plain-Python CTC references for the decoder tests (float64, dictionaries, no batching)."""

from __future__ import annotations

import itertools
import math

NEG = -math.inf


def logadd(*xs: float) -> float:
    m = max(xs)
    if m == NEG:
        return NEG
    return m + math.log(sum(math.exp(x - m) for x in xs))


def collapse(path: tuple[int, ...], blank: int) -> tuple[int, ...]:
    out, prev = [], None
    for s in path:
        if s != blank and s != prev:
            out.append(s)
        prev = s
    return tuple(out)


def brute_force_prefix_log_probs(lp: list[list[float]], blank: int) -> dict[tuple[int, ...], float]:
    """Exact log P(prefix) for every label sequence, by enumerating all V**T alignments."""
    totals: dict[tuple[int, ...], float] = {}
    vocab = len(lp[0])
    for path in itertools.product(range(vocab), repeat=len(lp)):
        score = sum(lp[t][s] for t, s in enumerate(path))
        key = collapse(path, blank)
        totals[key] = logadd(totals.get(key, NEG), score)
    return totals


def _add(
    beams: dict, prefix: tuple[int, ...], pb: float, pnb: float, times: tuple[int, ...]
) -> None:
    entry = beams.setdefault(prefix, [NEG, NEG, times])
    entry[0] = logadd(entry[0], pb)
    entry[1] = logadd(entry[1], pnb)


def prefix_beam_search(
    lp: list[list[float]], beam: int, blank: int
) -> list[tuple[tuple[int, ...], float, tuple[int, ...]]]:
    """Textbook CTC prefix beam search; returns (prefix, log-prob, first-emission frames)."""
    beams: dict[tuple[int, ...], tuple[float, float, tuple[int, ...]]] = {(): (0.0, NEG, ())}
    for t, frame in enumerate(lp):
        nxt: dict[tuple[int, ...], list] = {}
        for prefix, (pb, pnb, times) in beams.items():
            total = logadd(pb, pnb)
            _add(nxt, prefix, total + frame[blank], NEG, times)
            if prefix:
                _add(nxt, prefix, NEG, pnb + frame[prefix[-1]], times)
            for c, lpc in enumerate(frame):
                if c == blank:
                    continue
                new = prefix + (c,)
                base = pb if prefix and prefix[-1] == c else total
                new_times = beams[new][2] if new in beams else times + (t,)
                _add(nxt, new, NEG, base + lpc, new_times)
        ranked = sorted(nxt.items(), key=lambda kv: -logadd(kv[1][0], kv[1][1]))[:beam]
        beams = {p: (v[0], v[1], v[2]) for p, v in ranked}
    out = [(p, logadd(pb, pnb), times) for p, (pb, pnb, times) in beams.items()]
    return sorted(out, key=lambda x: -x[1])


def greedy(lp: list[list[float]], blank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Argmax collapse; returns tokens and the frame each was emitted at."""
    tokens, frames, prev = [], [], None
    for t, frame in enumerate(lp):
        s = max(range(len(frame)), key=frame.__getitem__)
        if s != blank and s != prev:
            tokens.append(s)
            frames.append(t)
        prev = s
    return tuple(tokens), tuple(frames)
