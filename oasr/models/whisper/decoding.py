"""Greedy Whisper decoding over any ``DecoderKvStore`` (dense or paged).

Logit rules (those of the reference CTranslate2 greedy search for a no-timestamps prompt): the
checkpoint's ``suppress_ids`` are never generated, and at the first generated step
``suppress_ids_begin`` (blank, end-of-transcript) are not either. Rows that emit the
end-of-transcript token are finished; the batch stops when every row is finished or after
``max_new_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from oasr.models.whisper.config import DecodingSpec
from oasr.models.whisper.dense_kv import DecoderKv
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
        next_tokens = logits.argmax(dim=-1)  # (B,)
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
    """Beam search of each of ``kv``'s B rows on dense per-group buffers.

    Every step keeps ``beam_size`` live beams per row (``kv.select`` copies the parents' K/V,
    so repeated parents are fine here, unlike on the paged pool). A candidate ending in the end
    token finishes with score ``log_prob / len ** length_penalty`` (len counts the end token);
    a row stops once it has ``beam_size`` finished hypotheses, all rows stop at the token cap.
    A row that stopped leaves the batch (its beams, and with a shared cross K/V its group:
    ``kv.keep_groups``), so a short segment decoded beside a long one costs its own steps only.

    Args:
        kv: an empty dense store of B rows (cross K/V stored, no tokens yet).
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
    batch, device = kv.batch_size, model.device
    always, first = suppression_masks(spec, model.config.n_vocab, device)
    if prompt is None:
        prompt = torch.tensor(spec.prompt, device=device).expand(batch, -1)
    elif prompt.size(1) - start > len(spec.prompt):
        first = always  # after a forced text prefix the transcript may end at once
    if stop is not None and stop():
        raise SearchStopped
    prompt_logits = model.decoder(prompt, kv)  # (B, P, V)
    no_speech = no_speech_probs(prompt_logits, spec, start)
    wanted = 2 * beam_size
    suppressed = suppressed_ids(spec, model.config.n_vocab, device)
    # each live beam's best ``wanted`` next tokens: their log-probs and ids (B * K, wanted)
    best, best_tokens = torch.log_softmax(prompt_logits[:, -1] + first, dim=-1).topk(wanted, dim=-1)
    scores = torch.zeros(batch, 1, device=device)  # (B, K) summed log-probs of live beams
    history = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)  # (B, K, t)
    token_lps = torch.zeros(batch, 1, 0, device=device)  # (B, K, t) each token's log-prob
    finished: list[list[BeamHypothesis]] = [[] for _ in range(batch)]
    rows = list(range(batch))  # the original row of each row still searched
    for step in range(limit):
        top_scores, parents, tokens = best_candidates(scores, best, best_tokens, wanted)
        picked = top_scores - scores.gather(1, parents)  # (B, 2K) the tokens' log-probs
        keep = _collect_finished([finished[r] for r in rows], top_scores, parents, tokens,
                                 history, spec.eot, beam_size, length_penalty,
                                 last_step=step + 1 == limit, token_lps=(token_lps, picked))
        if all(len(f) >= beam_size for f in finished) or step + 1 == limit:
            break
        if stop is not None and stop():
            raise SearchStopped
        width = history.size(1)
        groups = torch.arange(batch, device=device)  # each searched row's group in ``kv``
        live = [i for i, r in enumerate(rows) if len(finished[r]) < beam_size]
        if len(live) < batch:  # stopped rows leave the batch
            groups = torch.tensor(live, dtype=torch.long, device=device)
            top_scores, parents, tokens, picked, keep = (
                t.index_select(0, groups) for t in (top_scores, parents, tokens, picked, keep))
            history, token_lps = history.index_select(0, groups), token_lps.index_select(0, groups)
            kv.keep_groups(groups)
            rows, batch = [rows[i] for i in live], len(live)
        scores = top_scores.gather(1, keep)  # (B, K)
        chosen_parents, chosen_tokens = parents.gather(1, keep), tokens.gather(1, keep)
        kv.select((groups.unsqueeze(1) * width + chosen_parents).view(-1))  # rows of ``kv``
        flat = (torch.arange(batch, device=device).unsqueeze(1) * width
                + chosen_parents).view(-1)  # rows of ``history``
        history = torch.cat([history.view(batch * width, -1)[flat].view(batch, beam_size, -1),
                             chosen_tokens.unsqueeze(-1)], dim=-1)
        token_lps = torch.cat([token_lps.view(batch * width, -1)[flat].view(batch, beam_size, -1),
                               picked.gather(1, keep).unsqueeze(-1)], dim=-1)
        hidden = model.decoder.hidden(chosen_tokens.view(-1, 1), kv)[:, -1]  # (B*K, d)
        best, best_tokens = model.decoder.logits.top_log_probs(hidden, suppressed, wanted)
    chosen = [max(f, key=lambda h: h.score) for f in finished]
    return [BeamHypothesis(h.tokens, h.log_prob, h.score, ns, h.token_log_probs)
            for h, ns in zip(chosen, no_speech, strict=True)]


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
    ok = log_probs.argmax(dim=-1) == guess
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
    finished: list[list[BeamHypothesis]],
    top_scores: torch.Tensor,
    parents: torch.Tensor,
    tokens: torch.Tensor,
    history: torch.Tensor,
    eot: int,
    beam_size: int,
    length_penalty: float,
    last_step: bool,
    token_lps: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Move end-token candidates (all candidates at the last step) into ``finished``; returns
    (B, K) indices into the 2K candidates of the best ``beam_size`` that go on.
    ``token_lps``: the live beams' tokens' log-probs (B, K, t) and the candidates' (B, 2K),
    kept with each finished hypothesis."""
    keep_rows = []
    for b, row in enumerate(finished):
        keep: list[int] = []
        candidates = zip(top_scores[b].tolist(), parents[b].tolist(), tokens[b].tolist(), strict=True)
        for j, (score, parent, token) in enumerate(candidates):  # best first
            if len(keep) == beam_size:
                break  # end tokens ranked below the kept beams are not hypotheses
            prefix = history[b, parent].tolist()
            if token == eot or last_step:
                text = prefix if token == eot else prefix + [token]
                if len(row) < beam_size:
                    norm = max(len(text), 1) ** length_penalty
                    lps: tuple[float, ...] = ()
                    if token_lps is not None:
                        lps = tuple(token_lps[0][b, parent].tolist())
                        lps += () if token == eot else (float(token_lps[1][b, j]),)
                    row.append(BeamHypothesis(tuple(text), score, score / norm,
                                              token_log_probs=lps))
            else:
                keep.append(j)
        keep_rows.append(keep + [keep[-1] if keep else 0] * (beam_size - len(keep)))
    return torch.tensor(keep_rows, dtype=torch.long, device=top_scores.device)
