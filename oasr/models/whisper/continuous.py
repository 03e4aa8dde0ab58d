"""Continuous batching of Whisper second-pass requests on the paged decoder pool.

Requests (a segment's waveform, or its encoder states) wait in FIFO order; each ``step`` admits
what the pool can reserve (``can_admit`` on each row's declared ceiling), encodes and prefills
the admitted rows together, advances every other running row by one token in ONE batched
decoder call, and returns the requests that finished. Rows join and leave between steps, at
any length; a row's pages are freed the step it finishes.

Every request is decoded under Whisper's safeguards (``oasr.models.whisper.safeguards``): its
rows stop at the token budget of its duration or as soon as they loop, and a failed decode is
queued again, ahead of new requests, at the next temperature (``best_of`` sampled rows, which
are batched with everything else like any row). A request finishes when a decode passes the
fallback rule or the temperatures run out (then its result says ``failed``).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from oasr.cache.decoder_kv import PagedDecoderKv
from oasr.models.whisper.decoding import (
    default_max_new_tokens,
    no_speech_probs,
    suppression_masks,
)
from oasr.models.whisper.frontend import HOP_LENGTH, N_SAMPLES
from oasr.models.whisper.loader import WhisperCheckpoint
from oasr.models.whisper.safeguards import DecodeAttempt, best_attempt
from oasr.models.whisper.transcriber import WhisperDecodeConfig, build_decoder_manager
from oasr.models.whisper.window import EncodedSegments, SegmentEncoder

_SAMPLES_PER_ENCODER_FRAME = 2 * HOP_LENGTH  # the encoder's stride-2 stem: 20 ms


@dataclass(frozen=True)
class SecondPassResult:
    """A finished request.

    Attributes:
        request_id: as submitted.
        tokens: generated text tokens (no prompt, no end token).
        text: their text.
        avg_log_prob: log-probability per generated token (end token included).
        no_speech_prob: P(no-speech) at the start token (None if the vocabulary has none);
            with a low ``avg_log_prob`` it flags a segment with no speech.
        temperature: of the kept decode (0 = greedy).
        num_decodes: decodes tried (1 = no fallback).
        failed: every temperature failed the fallback rule; the text is the best of them and
            should not be trusted.
        looped: the kept decode was stopped by the repetition rule.
    """

    request_id: int
    tokens: tuple[int, ...]
    text: str
    avg_log_prob: float
    no_speech_prob: float | None
    temperature: float = 0.0
    num_decodes: int = 1
    failed: bool = False
    looped: bool = False


@dataclass
class _Request:
    """A request across its decodes: budget, encoder states (kept for fallback), attempts."""

    request_id: int
    max_new_tokens: int
    encoded: EncodedSegments | None = None  # (1, S, d) once encoded
    attempts: list[DecodeAttempt] = field(default_factory=list)
    temperature_index: int = 0
    samples: list[DecodeAttempt] = field(default_factory=list)  # this temperature's rows so far
    num_rows: int = 1  # rows decoding this temperature


@dataclass
class _Pending:
    request: _Request
    waveform: torch.Tensor | np.ndarray | None = None


@dataclass
class _Running:
    request: _Request
    row_id: int
    temperature: float
    no_speech_prob: float | None = None
    log_prob: float = 0.0
    tokens: list[int] = field(default_factory=list)


class ContinuousWhisperDecoder:
    """Whisper over requests that arrive and finish at different times.

    Invariant: every running row owns one decoder row (``row_id``) whose self-attention holds
    its prompt and all its tokens but the last; the last is the next step's input. At
    temperature 0 the tokens equal ``greedy_decode``'s for the same encoder states (waveforms
    are encoded by a ``SegmentEncoder`` with the config's window) up to the request's token
    budget, whatever else shares the batch.
    """

    def __init__(self, checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig | None = None,
                 seed: int = 0) -> None:
        self.checkpoint = checkpoint
        self.config = config or WhisperDecodeConfig()
        model, spec = checkpoint.model, checkpoint.spec
        self.max_new_tokens = self.config.max_new_tokens or default_max_new_tokens(model, spec)
        self.ceiling = len(spec.prompt) + self.max_new_tokens
        self.manager = build_decoder_manager(checkpoint, self.config)
        self.encoder = SegmentEncoder(model, self.config.encoder_window)
        self.best_of = min(self.config.fallback.best_of, self.config.max_rows)
        self._always, self._first = suppression_masks(spec, model.config.n_vocab, model.device)
        self._generator = torch.Generator(device=model.device).manual_seed(seed)
        self._waiting: deque[_Pending] = deque()
        self._running: list[_Running] = []
        self._row_ids = itertools.count()
        self._view: PagedDecoderKv | None = None  # kept while the running rows stay the same
        self.num_fallbacks = 0  # decodes redone at a higher temperature
        self.num_loops = 0  # rows stopped by the repetition rule

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def budget(self, num_samples: int) -> int:
        """Tokens a segment of ``num_samples`` may generate (the token budget, capped)."""
        rule = self.config.token_budget
        return self.max_new_tokens if rule is None else rule.max_tokens(num_samples,
                                                                         self.max_new_tokens)

    def submit(self, request_id: int, waveform: torch.Tensor | np.ndarray) -> None:
        """Queue a 16 kHz mono waveform of at most 30 s.

        Raises:
            ValueError: the waveform is not 1-D or is longer than one 30 s window.
        """
        shape = tuple(waveform.shape)
        if len(shape) != 1 or shape[0] > N_SAMPLES:
            raise ValueError(f"request {request_id}: waveform of shape {shape}; Whisper takes a "
                             f"1-D waveform of at most {N_SAMPLES} samples (30 s)")
        request = _Request(request_id, self.budget(shape[0]))
        self._waiting.append(_Pending(request, waveform=waveform))

    def submit_encoded(self, request_id: int, encoded: torch.Tensor,
                       num_samples: int | None = None) -> None:
        """Queue encoder states (S, d) computed elsewhere; the token budget comes from
        ``num_samples`` (default: the audio all S frames stand for)."""
        samples = encoded.size(0) * _SAMPLES_PER_ENCODER_FRAME if num_samples is None else num_samples
        states = EncodedSegments(encoded[None], (encoded.size(0),))
        self._waiting.append(_Pending(_Request(request_id, self.budget(samples), states)))

    @torch.inference_mode()
    def step(self) -> list[SecondPassResult]:
        """Admit, prefill the admitted, advance the others by one token; the finished."""
        stepping = list(self._running)
        finished = self._advance(stepping) if stepping else []
        admitted = self._admit()
        if admitted:
            finished += self._prefill(admitted)
        return finished

    def _temperature(self, request: _Request) -> float:
        return self.config.fallback.temperatures[request.temperature_index]

    def _rows_for(self, request: _Request) -> int:
        return 1 if self._temperature(request) == 0.0 else self.best_of

    def _admit(self) -> list[_Pending]:
        admitted: list[_Pending] = []
        ceilings: list[int] = []
        while self._waiting:
            request = self._waiting[0].request
            rows = self._rows_for(request)
            wanted = ceilings + [len(self.checkpoint.spec.prompt) + request.max_new_tokens] * rows
            if len(self._running) + len(wanted) > self.config.max_rows:
                break
            if not self.manager.can_admit(wanted).ok:
                break
            ceilings = wanted
            admitted.append(self._waiting.popleft())
        return admitted

    def _encode(self, pending: list[_Pending]) -> None:
        """Encode the admitted requests that arrived as waveforms (one batched call)."""
        fresh = [p for p in pending if p.request.encoded is None]
        if not fresh:
            return
        waves = [p.waveform for p in fresh if p.waveform is not None]
        encoded = self.encoder.encode(waves)
        for row, p in enumerate(fresh):
            p.request.encoded = EncodedSegments(encoded.states[row : row + 1],
                                                (encoded.num_encoded[row],))
            p.waveform = None

    def _prefill(self, admitted: list[_Pending]) -> list[SecondPassResult]:
        model, spec = self.checkpoint.model, self.checkpoint.spec
        self._encode(admitted)
        rows: list[_Running] = []
        for p in admitted:
            p.request.num_rows = self._rows_for(p.request)
            p.request.samples = []
            rows += [_Running(p.request, next(self._row_ids), self._temperature(p.request))
                     for _ in range(p.request.num_rows)]
        states = [r.request.encoded for r in rows]
        encoded = EncodedSegments(torch.cat([s.states for s in states if s is not None]),
                                  tuple(s.num_encoded[0] for s in states if s is not None))
        try:
            for row in rows:
                self.manager.allocate_row(row.row_id, len(spec.prompt) + row.request.max_new_tokens)
            self.manager.build_cross_kv([r.row_id for r in rows], self.encoder.cross_kv(encoded))
            prompt = torch.tensor(spec.prompt, device=model.device).expand(len(rows), -1)
            view = self.manager.view([r.row_id for r in rows])
            prompt_logits = model.decoder(prompt, view)  # (B, P, V)
        except Exception:  # the requests are dropped; their pages must not leak
            for row in rows:
                if self.manager.has_row(row.row_id):
                    self.manager.free_row(row.row_id)
            raise
        for row, prob in zip(rows, no_speech_probs(prompt_logits, spec), strict=True):
            row.no_speech_prob = prob
        return self._record(rows, prompt_logits[:, -1] + self._first)

    def _advance(self, rows: list[_Running]) -> list[SecondPassResult]:
        model = self.checkpoint.model
        last = torch.tensor([[r.tokens[-1]] for r in rows], device=model.device)  # (B, 1)
        row_ids = [r.row_id for r in rows]
        if self._view is None or self._view.row_ids != row_ids:  # the batch changed
            self._view = self.manager.view(row_ids)
        view = self._view
        return self._record(rows, model.decoder(last, view)[:, -1] + self._always)

    def _pick(self, rows: list[_Running], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Each row's next token from its logits (B, V): argmax at temperature 0, else sampled
        from softmax(logits / T); with the token's log-probability under the plain logits."""
        picked = logits.argmax(dim=-1)  # (B,)
        temps = [r.temperature for r in rows]
        if any(temps):
            scale = torch.tensor([t or 1.0 for t in temps], device=logits.device)[:, None]
            probs = torch.softmax(logits.float() / scale, dim=-1)  # (B, V)
            sampled = torch.multinomial(probs, 1, generator=self._generator)[:, 0]
            hot = torch.tensor([t > 0 for t in temps], device=logits.device)
            picked = torch.where(hot, sampled, picked)
        picked_lp = torch.log_softmax(logits.float(), dim=-1).gather(1, picked[:, None])[:, 0]
        return picked.tolist(), picked_lp.tolist()

    def _record(self, rows: list[_Running], logits: torch.Tensor) -> list[SecondPassResult]:
        """Append each row's next token; finish rows (free them) on the end token, the budget
        or a loop, and requests whose decode is complete."""
        eot = self.checkpoint.spec.eot
        repetition = self.config.repetition
        done: list[SecondPassResult] = []
        finished_rows: set[int] = set()
        for row, token, lp in zip(rows, *self._pick(rows, logits), strict=True):
            row.tokens.append(token)
            row.log_prob += lp
            looped = repetition is not None and token != eot and repetition.is_looping(row.tokens)
            truncated = token != eot and len(row.tokens) == row.request.max_new_tokens
            if token == eot or looped or truncated:
                self.num_loops += looped
                self.manager.free_row(row.row_id)
                finished_rows.add(row.row_id)
                result = self._finish_row(row, looped, truncated)
                if result is not None:
                    done.append(result)
        known = {r.row_id for r in self._running}
        joined = self._running + [r for r in rows if r.row_id not in known]
        self._running = [r for r in joined if r.row_id not in finished_rows]
        return done

    def _finish_row(self, row: _Running, looped: bool, truncated: bool) -> SecondPassResult | None:
        """Record a finished row's decode; the request's result once it has one to give."""
        eot = self.checkpoint.spec.eot
        tokens = tuple(row.tokens[:-1] if row.tokens[-1] == eot else row.tokens)
        request = row.request
        request.samples.append(DecodeAttempt(
            tokens, self.checkpoint.tokenizer.decode(tokens), row.temperature,
            row.log_prob / (len(tokens) + 1), row.no_speech_prob, looped, truncated))
        if len(request.samples) < request.num_rows:
            return None  # sampled rows of this temperature still running
        attempt = max(request.samples, key=lambda a: a.avg_log_prob)
        request.attempts.append(attempt)
        rule = self.config.fallback
        failed = rule.is_failed(attempt)
        if failed and request.temperature_index + 1 < len(rule.temperatures):
            request.temperature_index += 1
            self.num_fallbacks += 1
            self._waiting.appendleft(_Pending(request))  # ahead of new requests
            return None
        kept = best_attempt(request.attempts, rule) if failed else attempt
        return SecondPassResult(request.request_id, kept.tokens, kept.text, kept.avg_log_prob,
                                request.attempts[0].no_speech_prob, kept.temperature,
                                len(request.attempts), failed, kept.looped)

    def abort(self, request_id: int) -> bool:
        """Drop a waiting or running request (its rows freed now); False when unknown."""
        found = False
        for pending in list(self._waiting):
            if pending.request.request_id == request_id:
                self._waiting.remove(pending)
                found = True
        for row in list(self._running):
            if row.request.request_id == request_id:
                self.manager.free_row(row.row_id)
                self._running.remove(row)
                found = True
        return found
