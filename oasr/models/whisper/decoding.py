"""Greedy Whisper decoding over any ``DecoderKvStore`` (dense or paged).

Logit rules (those of the reference CTranslate2 greedy search for a no-timestamps prompt): the
checkpoint's ``suppress_ids`` are never generated, and at the first generated step
``suppress_ids_begin`` (blank, end-of-transcript) are not either. Rows that emit the
end-of-transcript token are finished; the batch stops when every row is finished or after
``max_new_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from oasr.models.whisper.config import DecodingSpec
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.logits import best_indices
from oasr.models.whisper.model import DecoderKvStore, WhisperModel


@dataclass(frozen=True)
class WhisperTranscript:
    """One row's result.

    Attributes:
        tokens: generated text tokens (no prompt, no end token).
        text: their text.
        avg_log_prob: log-probability per generated token (end token included).
        no_speech_prob: P(no-speech) at the start token; None if the vocabulary has none.
    """

    tokens: tuple[int, ...]
    text: str
    avg_log_prob: float = 0.0
    no_speech_prob: float | None = None


def suppression_masks(spec: DecodingSpec, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive (V,) float32 masks: always-suppressed ids (`suppressed_ids`), and those
    suppressed at step one."""
    always = torch.zeros(vocab, device=device)
    always[suppressed_ids(spec, vocab, device)] = float("-inf")
    first = always.clone()
    begin = [t for t in spec.suppress_ids_begin if 0 <= t < vocab]
    first[torch.tensor(begin, dtype=torch.long, device=device)] = float("-inf")
    return always, first


def suppressed_ids(spec: DecodingSpec, vocab: int, device: torch.device) -> torch.Tensor:
    """(S,) int64: the ids suppressed at every step, for `LogitsProjection.top_log_probs`
    (``suppression_masks``' ``always`` mask is -inf at them)."""
    ids = sorted({t for t in spec.suppress_ids if 0 <= t < vocab})
    return torch.tensor(ids, dtype=torch.long, device=device)


def default_max_new_tokens(model: WhisperModel, spec: DecodingSpec) -> int:
    """Tokens a row may generate: the decoder's positions minus the prompt."""
    return model.config.n_text_ctx - len(spec.prompt)


@dataclass(frozen=True)
class GreedyHypothesis:
    """One row's greedy result.

    Attributes:
        tokens: generated text tokens (no prompt, no end token).
        log_prob: summed log-probability (after suppression) of the tokens and the end token.
        no_speech_prob: probability of the no-speech token at the start token's position
            (None when the checkpoint has no such token).
    """

    tokens: tuple[int, ...]
    log_prob: float
    no_speech_prob: float | None

    @property
    def avg_log_prob(self) -> float:
        """``log_prob`` per generated token, end token included."""
        return self.log_prob / (len(self.tokens) + 1)


def no_speech_probs(logits: torch.Tensor, spec: DecodingSpec,
                    start: int = 0) -> list[float | None]:
    """P(no-speech) per row from the prompt's logits (B, P, V) at the start token (index
    ``start``: after a previous-text prompt, its length)."""
    if spec.no_speech is None:
        return [None] * logits.size(0)
    return torch.softmax(logits[:, start].float(), dim=-1)[:, spec.no_speech].tolist()


@torch.inference_mode()
def greedy_search(
    model: WhisperModel,
    spec: DecodingSpec,
    kv: DecoderKvStore,
    batch_size: int,
    max_new_tokens: int | None = None,
) -> list[GreedyHypothesis]:
    """Greedy decoding of ``batch_size`` rows whose cross K/V ``kv`` already holds.

    Args:
        model: the Whisper model.
        spec: prompt, end token and suppression lists.
        kv: an empty store of ``batch_size`` rows (self-attention holds nothing yet).
        batch_size: B.
        max_new_tokens: cap on generated tokens per row (default: all positions left).
    Returns:
        Per row its tokens, summed log-probability and no-speech probability.
    """
    limit = default_max_new_tokens(model, spec) if max_new_tokens is None else max_new_tokens
    if not 1 <= limit <= default_max_new_tokens(model, spec):
        raise ValueError(
            f"max_new_tokens must be in 1..{default_max_new_tokens(model, spec)}, got {limit}"
        )
    device = model.device
    always, first = suppression_masks(spec, model.config.n_vocab, device)
    prompt = torch.tensor(spec.prompt, device=device).expand(batch_size, -1)  # (B, P)
    prompt_logits = model.decoder(prompt, kv)  # (B, P, V)
    no_speech = no_speech_probs(prompt_logits, spec)
    logits = prompt_logits[:, -1] + first  # (B, V)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    log_prob = torch.zeros(batch_size, device=device)
    steps: list[torch.Tensor] = []
    for step in range(limit):
        next_tokens = best_indices(logits)  # (B,)
        picked = torch.log_softmax(logits, dim=-1).gather(1, next_tokens[:, None])[:, 0]
        log_prob += torch.where(finished, torch.zeros_like(picked), picked)
        next_tokens = torch.where(finished, torch.full_like(next_tokens, spec.eot), next_tokens)
        steps.append(next_tokens)
        finished |= next_tokens == spec.eot
        if step + 1 == limit or bool(finished.all()):
            break
        logits = model.decoder(next_tokens.unsqueeze(1), kv)[:, -1] + always
    grid = torch.stack(steps, dim=1).tolist()  # (B, steps)
    return [
        GreedyHypothesis(tuple(_until_eot(row, spec.eot)), lp, ns)
        for row, lp, ns in zip(grid, log_prob.tolist(), no_speech, strict=True)
    ]


def greedy_decode(
    model: WhisperModel,
    spec: DecodingSpec,
    kv: DecoderKvStore,
    batch_size: int,
    max_new_tokens: int | None = None,
) -> list[list[int]]:
    """``greedy_search``'s tokens only: per row the generated tokens (no prompt, no end)."""
    hyps = greedy_search(model, spec, kv, batch_size, max_new_tokens)
    return [list(h.tokens) for h in hyps]


def _until_eot(row: list[int], eot: int) -> list[int]:
    return row[: row.index(eot)] if eot in row else row


class SearchStopped(Exception):
    """A beam search given up midway: its caller's ``stop`` said nobody wants its rows."""


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished beam: text tokens, summed log-probability, and the length-normalised score;
    ``token_log_probs``: each text token's log-probability (the end token's left out)."""

    tokens: tuple[int, ...]
    log_prob: float
    score: float
    no_speech_prob: float | None = None
    token_log_probs: tuple[float, ...] = ()


@torch.inference_mode()
def beam_search(
    model: WhisperModel,
    spec: DecodingSpec,
    kv: DecoderKv,
    beam_size: int,
    max_new_tokens: int | None = None,
    length_penalty: float = 1.0,
    prompt: torch.Tensor | None = None,
    stop: Callable[[], bool] | None = None,
    start: int = 0,
) -> list[BeamHypothesis]:
    """Beam search of each of ``kv``'s B rows to its end (a `BeamSearch` of them alone).

    Args:
        kv: an empty dense store of B rows (cross K/V stored, no tokens yet).
        max_new_tokens: tokens each row may generate (default: all positions left).
        prompt: (B, P) start tokens per row (default ``spec.prompt``); tokens after
            ``spec.prompt`` are a forced text prefix, which the hypotheses do not include.
        stop: asked before each decoder call; True gives the search up (the caller no
            longer wants any of its rows).
        start: where ``spec.prompt`` begins in ``prompt`` (after a previous-text prompt).
    Returns:
        Per row the best hypothesis.
    Raises:
        SearchStopped: ``stop`` said so.
    """
    limit = max_new_tokens or default_max_new_tokens(model, spec)
    search = BeamSearch(model, spec, beam_size, length_penalty)
    if stop is not None and stop():
        raise SearchStopped
    rows = range(kv.batch_size)
    search.start(kv, list(rows), [limit] * len(rows), prompt, start)
    found: dict[object, BeamHypothesis] = {}
    while search.num_groups:
        found.update(search.step(stop))
    return [found[row] for row in rows]


@dataclass
class _BeamGroup:
    """One segment of a running `BeamSearch`: its live beams' tokens and their log-probs,
    the hypotheses it finished, and the tokens it may take."""

    key: object
    limit: int
    no_speech_prob: float | None
    history: list[list[int]]
    token_lps: list[list[float]]
    finished: list[BeamHypothesis] = field(default_factory=list)
    steps: int = 0  # tokens chosen so far


class BeamSearch:
    """Beam search of a batch of segments, one token a `step`, on one dense store.

    Every group (a segment) keeps ``beam_size`` live beams. A step ranks each group's best
    continuations, moves those ending in the end token into its finished hypotheses (with
    score ``log_prob / len ** length_penalty``, len counting the end token), keeps the best
    ``beam_size`` that go on (``DecoderKv.select`` copies their parents' K/V) and runs them
    through the decoder in ONE call. A group ends once it has ``beam_size`` hypotheses or has
    taken its own ``limit`` of tokens, and leaves the store (``DecoderKv.keep_groups``), so a
    short segment searched beside a long one costs its own steps only; `drop` takes a group
    out between steps. Its callers step it to its end: `beam_search`, and the continuous
    decoder, which searches a batch within one of its steps and drops the segments aborted
    meanwhile before each token.

    Invariant: a group's result does not depend on the groups beside it (up to the rounding
    of batched matrix products): its rows attend only their own tokens and frames, and its
    own ``limit`` ends it.
    """

    def __init__(self, model: WhisperModel, spec: DecodingSpec, beam_size: int,
                 length_penalty: float = 1.0) -> None:
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        self.model, self.spec = model, spec
        self.beam_size, self.length_penalty = beam_size, length_penalty
        self.wanted = 2 * beam_size  # candidates ranked per group
        device = model.device
        self._always, self._first = suppression_masks(spec, model.config.n_vocab, device)
        self._suppressed = suppressed_ids(spec, model.config.n_vocab, device)
        self.kv: DecoderKv | None = None
        self.groups: list[_BeamGroup] = []
        # (G, K) summed log-probs of the live beams; (G * K, wanted) each beam's likeliest
        # next tokens' log-probs and ids
        self._scores = self._best = self._best_tokens = torch.empty(0)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def group_keys(self) -> list[object]:
        """The keys of the groups being searched (their order changes as groups leave)."""
        return [g.key for g in self.groups]

    @torch.inference_mode()
    def start(self, kv: DecoderKv, keys: Sequence[object], limits: Sequence[int],
              prompt: torch.Tensor | None = None, start: int = 0) -> None:
        """Begin searching ``kv``'s rows, one group each: their prompts through the decoder
        (one call), their first candidates ranked at the first `step`.

        Args:
            kv: an empty dense store of G rows (cross K/V stored).
            keys: each group's key (returned with its hypothesis); ``limits``: the tokens
                each may generate.
            prompt: (G, P) start tokens (default ``spec.prompt``), as `beam_search`'s.
            start: where ``spec.prompt`` begins in ``prompt``.
        Raises:
            ValueError: a search is still running, the store is not empty, or the keys and
                limits do not match its rows.
        """
        batch, spec, device = kv.batch_size, self.spec, self.model.device
        if self.groups:
            raise ValueError(f"BeamSearch.start: {len(self.groups)} groups are still searched")
        if not len(keys) == len(limits) == batch:
            raise ValueError(f"{len(keys)} keys and {len(limits)} limits for {batch} rows")
        if kv.num_tokens:
            raise ValueError("BeamSearch.start takes an empty store")
        first = self._first
        if prompt is None:
            prompt = torch.tensor(spec.prompt, device=device).expand(batch, -1)
        elif prompt.size(1) - start > len(spec.prompt):
            first = self._always  # after a forced text prefix the transcript may end at once
        prompt_logits = self.model.decoder(prompt, kv)  # (G, P, V)
        no_speech = no_speech_probs(prompt_logits, spec, start)
        self._best, self._best_tokens = torch.log_softmax(prompt_logits[:, -1] + first,
                                                          dim=-1).topk(self.wanted, dim=-1)
        self._scores = torch.zeros(batch, 1, device=device)  # one live beam until the first step
        self.kv = kv
        self.groups = [_BeamGroup(key, limit, ns, [[]], [[]])
                       for key, limit, ns in zip(keys, limits, no_speech, strict=True)]

    @torch.inference_mode()
    def drop(self, key: object) -> bool:
        """Stop searching group ``key`` (nothing returned for it); False when unknown."""
        kept = [i for i, g in enumerate(self.groups) if g.key != key]
        if len(kept) == len(self.groups):
            return False
        if not kept:
            self.clear()
            return True
        assert self.kv is not None
        order = self.kv.keep_groups(kept)
        index = torch.tensor(order, dtype=torch.long, device=self._scores.device)
        width = self._scores.size(1)  # live beams per group: 1 before the first step
        rows = (index.unsqueeze(1) * width + torch.arange(width, device=index.device)).view(-1)
        self.kv.select(rows)
        self._scores = self._scores.index_select(0, index)
        self._best, self._best_tokens = (self._best.index_select(0, rows),
                                         self._best_tokens.index_select(0, rows))
        self.groups = [self.groups[i] for i in order]
        return True

    @torch.inference_mode()
    def step(self, stop: Callable[[], bool] | None = None) -> list[tuple[object, BeamHypothesis]]:
        """One token for every group: the groups that ended, each with its best hypothesis.

        Raises:
            SearchStopped: ``stop`` (asked before the decoder call) said so.
        """
        if not self.groups:
            return []
        assert self.kv is not None
        groups = self.groups
        width = self._scores.size(1)  # live beams per group: 1 before the first step
        top_scores, parents, tokens = best_candidates(self._scores, self._best,
                                                      self._best_tokens, self.wanted)
        picked = top_scores - self._scores.gather(1, parents)  # (G, 2K) the tokens' log-probs
        last = [g.steps + 1 >= g.limit for g in groups]
        keep = _collect_finished(groups, top_scores, parents, tokens, picked, self.spec.eot,
                                 self.beam_size, self.length_penalty, last)
        ended: list[int] = []
        live: list[int] = []
        for i, group in enumerate(groups):
            group.steps += 1
            (ended if len(group.finished) >= self.beam_size or last[i] else live).append(i)
        results = []
        for i in ended:
            best = max(groups[i].finished, key=lambda h: h.score)
            results.append((groups[i].key, BeamHypothesis(
                best.tokens, best.log_prob, best.score, groups[i].no_speech_prob,
                best.token_log_probs)))
        if not live:
            self.clear()
            return results
        if stop is not None and stop():
            raise SearchStopped
        index = torch.arange(len(groups), device=keep.device)
        if len(live) < len(groups):  # ended groups leave the batch
            order = self.kv.keep_groups(live)
            index = torch.tensor(order, dtype=torch.long, device=keep.device)
            top_scores, parents, tokens, picked, keep = (
                t.index_select(0, index) for t in (top_scores, parents, tokens, picked, keep))
            groups = self.groups = [groups[i] for i in order]
        self._scores = top_scores.gather(1, keep)  # (G, K)
        chosen_parents, chosen_tokens = parents.gather(1, keep), tokens.gather(1, keep)
        self.kv.select((index.unsqueeze(1) * width + chosen_parents).view(-1))
        lps = picked.gather(1, keep).tolist()
        for group, row_parents, row_tokens, row_lps in zip(
                groups, chosen_parents.tolist(), chosen_tokens.tolist(), lps, strict=True):
            group.history = [group.history[p] + [t] for p, t in zip(row_parents, row_tokens, strict=True)]
            group.token_lps = [group.token_lps[p] + [lp] for p, lp in zip(row_parents, row_lps, strict=True)]
        hidden = self.model.decoder.hidden(chosen_tokens.view(-1, 1), self.kv)[:, -1]  # (G*K, d)
        self._best, self._best_tokens = self.model.decoder.logits.top_log_probs(
            hidden, self._suppressed, self.wanted)
        return results

    def clear(self) -> None:
        """Stop searching every group (the store is let go)."""
        self.kv, self.groups = None, []
        self._scores = self._best = self._best_tokens = torch.empty(0)


def draft_tensor(drafts: Sequence[Sequence[int]], pad: int,
                 device: torch.device) -> torch.Tensor:
    """(B, D) the rows' drafts, shorter ones padded with ``pad``."""
    rows = [list(d) for d in drafts]
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long,
                        device=device).view(len(rows), width)


def accepted_draft(logits: torch.Tensor, guess: torch.Tensor,
                   drafts: Sequence[Sequence[int]], first: torch.Tensor,
                   always: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) how many of its draft's first tokens each row takes, greedily: each is the model's
    first choice after the ones before it (so the row's tokens are those a greedy decode picks
    one by one), and not the end token's place (a draft never ends the transcript); and (B, D)
    each draft token's log-probability, as the decode scores its tokens.

    Args:
        logits: (B, 1 + D, V) the decoder's logits from the prompt's last token on.
        guess: (B, D) the drafts, padded (`draft_tensor`).
        first: additive mask of the first generated token; ``always``: of the others.
    """
    batch, width = guess.shape
    if not width:
        return (torch.zeros(batch, dtype=torch.long, device=guess.device),
                torch.zeros(batch, 0, device=guess.device))
    masks = torch.stack([first] + [always] * (width - 1))  # (D, V)
    log_probs = torch.log_softmax(logits[:, :width].float() + masks, dim=-1)  # (B, D, V)
    chosen = log_probs.gather(-1, guess[..., None])[..., 0]  # (B, D)
    ok = best_indices(log_probs) == guess
    lengths = torch.tensor([len(d) for d in drafts], device=guess.device)
    ok &= torch.arange(width, device=guess.device)[None] < lengths[:, None]
    return torch.cumprod(ok.long(), dim=1).sum(dim=1), chosen  # per row: the agreeing run


def best_candidates(scores: torch.Tensor, best: torch.Tensor, best_tokens: torch.Tensor,
                    wanted: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``wanted`` best continuations of each row's live beams, best first: their summed
    log-probabilities, parent beams and tokens, each (B, wanted).

    Args:
        scores: (B, W) summed log-probabilities of the W live beams of each row.
        best: (B * W, C) each beam's C >= ``wanted`` likeliest next tokens' log-probabilities
            (`LogitsProjection.top_log_probs`), and ``best_tokens`` (B * W, C) their ids.

    A row's best ``wanted`` candidates are among its beams' own best ``wanted`` tokens, so
    those are ranked (B, W * C), not all W * V (a 5-beam step: 50 of 259,320)."""
    batch, width = scores.shape
    per_beam = best.size(-1)
    top_scores, top_ids = (scores.unsqueeze(-1) + best.view(batch, width, -1)).view(
        batch, -1).topk(wanted, dim=-1)
    return top_scores, top_ids // per_beam, best_tokens.view(batch, -1).gather(1, top_ids)


def _collect_finished(
    groups: list[_BeamGroup],
    top_scores: torch.Tensor,
    parents: torch.Tensor,
    tokens: torch.Tensor,
    picked: torch.Tensor,
    eot: int,
    beam_size: int,
    length_penalty: float,
    last_step: list[bool],
) -> torch.Tensor:
    """Move end-token candidates (all candidates at a group's last step) into its
    ``finished``; returns (G, K) indices into the 2K candidates of the best ``beam_size`` that
    go on. ``picked``: the candidates' own tokens' log-probs (G, 2K), kept with each finished
    hypothesis after its parent's."""
    keep_rows = []
    rows = zip(groups, top_scores.tolist(), parents.tolist(), tokens.tolist(), picked.tolist(),
               last_step, strict=True)
    for group, row_scores, row_parents, row_tokens, row_picked, last in rows:
        keep: list[int] = []
        candidates = zip(row_scores, row_parents, row_tokens, row_picked, strict=True)
        for j, (score, parent, token, lp) in enumerate(candidates):  # best first
            if len(keep) == beam_size:
                break  # end tokens ranked below the kept beams are not hypotheses
            if token == eot or last:
                prefix = group.history[parent]
                text = prefix if token == eot else prefix + [token]
                if len(group.finished) < beam_size:
                    norm = max(len(text), 1) ** length_penalty
                    lps = tuple(group.token_lps[parent]) + (() if token == eot else (lp,))
                    group.finished.append(BeamHypothesis(tuple(text), score, score / norm,
                                                         token_log_probs=lps))
            else:
                keep.append(j)
        keep_rows.append(keep + [keep[-1] if keep else 0] * (beam_size - len(keep)))
    return torch.tensor(keep_rows, dtype=torch.long, device=top_scores.device)
