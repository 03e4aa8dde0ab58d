"""Continuous batching of Whisper second-pass requests on the paged decoder pool.

Requests (a segment's waveform, or its encoder states) wait in FIFO order; each ``step`` admits
what the pool can reserve (``can_admit`` on each row's declared ceiling), encodes and prefills
the admitted rows together, advances every other running row by one token in ONE batched
decoder call, and returns the requests that finished (end token or token cap). Rows join and
leave between steps, at any length; a row's pages are freed the step it finishes.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from oasr.cache.decoder_kv import PagedDecoderKv
from oasr.models.whisper.decoding import (
    default_max_new_tokens,
    no_speech_probs,
    suppression_masks,
)
from oasr.models.whisper.frontend import N_SAMPLES
from oasr.models.whisper.loader import WhisperCheckpoint
from oasr.models.whisper.transcriber import WhisperDecodeConfig, build_decoder_manager
from oasr.models.whisper.window import EncodedSegments, SegmentEncoder


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
    """

    request_id: int
    tokens: tuple[int, ...]
    text: str
    avg_log_prob: float
    no_speech_prob: float | None


@dataclass
class _Pending:
    request_id: int
    waveform: torch.Tensor | np.ndarray | None = None
    encoded: torch.Tensor | None = None  # (S, d)


@dataclass
class _Running:
    request_id: int
    row_id: int
    no_speech_prob: float | None = None
    log_prob: float = 0.0
    tokens: list[int] = field(default_factory=list)


class ContinuousWhisperDecoder:
    """Greedy Whisper over requests that arrive and finish at different times.

    Invariant: every running request owns one decoder row (``row_id``) whose self-attention
    holds its prompt and all its tokens but the last; the last is the next step's input. The
    tokens equal ``greedy_decode``'s for the same encoder states (waveforms are encoded by a
    ``SegmentEncoder`` with the config's window), whatever else shares the batch.
    """

    def __init__(self, checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig | None = None) -> None:
        self.checkpoint = checkpoint
        self.config = config or WhisperDecodeConfig()
        model, spec = checkpoint.model, checkpoint.spec
        self.max_new_tokens = self.config.max_new_tokens or default_max_new_tokens(model, spec)
        self.ceiling = len(spec.prompt) + self.max_new_tokens
        self.manager = build_decoder_manager(checkpoint, self.config)
        self.encoder = SegmentEncoder(model, self.config.encoder_window)
        self._always, self._first = suppression_masks(spec, model.config.n_vocab, model.device)
        self._waiting: deque[_Pending] = deque()
        self._running: list[_Running] = []
        self._row_ids = itertools.count()
        self._view: PagedDecoderKv | None = None  # kept while the running rows stay the same

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def submit(self, request_id: int, waveform: torch.Tensor | np.ndarray) -> None:
        """Queue a 16 kHz mono waveform of at most 30 s.

        Raises:
            ValueError: the waveform is not 1-D or is longer than one 30 s window.
        """
        shape = tuple(waveform.shape)
        if len(shape) != 1 or shape[0] > N_SAMPLES:
            raise ValueError(f"request {request_id}: waveform of shape {shape}; Whisper takes a "
                             f"1-D waveform of at most {N_SAMPLES} samples (30 s)")
        self._waiting.append(_Pending(request_id, waveform=waveform))

    def submit_encoded(self, request_id: int, encoded: torch.Tensor) -> None:
        """Queue encoder states (S, d) computed elsewhere."""
        self._waiting.append(_Pending(request_id, encoded=encoded))

    @torch.inference_mode()
    def step(self) -> list[SecondPassResult]:
        """Admit, prefill the admitted, advance the others by one token; the finished."""
        stepping = list(self._running)
        finished = self._advance(stepping) if stepping else []
        admitted = self._admit()
        if admitted:
            finished += self._prefill(admitted)
        return finished

    def _admit(self) -> list[_Pending]:
        admitted: list[_Pending] = []
        while self._waiting and len(self._running) + len(admitted) < self.config.max_rows:
            if not self.manager.can_admit([self.ceiling] * (len(admitted) + 1)).ok:
                break
            admitted.append(self._waiting.popleft())
        return admitted

    def _encode(self, pending: list[_Pending]) -> EncodedSegments:
        waves = [p.waveform for p in pending if p.waveform is not None]
        fresh = self.encoder.encode(waves) if waves else None
        rows: Iterator[int] = iter(range(len(waves)))
        states: list[torch.Tensor] = []  # each (S, d)
        num_encoded: list[int] = []
        for p in pending:
            if p.encoded is not None:
                states.append(p.encoded)
                num_encoded.append(p.encoded.size(0))
            else:
                assert fresh is not None
                row = next(rows)
                states.append(fresh.states[row])
                num_encoded.append(fresh.num_encoded[row])
        return EncodedSegments(torch.stack(states), tuple(num_encoded))

    def _prefill(self, admitted: list[_Pending]) -> list[SecondPassResult]:
        model, spec = self.checkpoint.model, self.checkpoint.spec
        encoded = self._encode(admitted)  # states (B, S, d)
        rows = [_Running(p.request_id, next(self._row_ids)) for p in admitted]
        try:
            for row in rows:
                self.manager.allocate_row(row.row_id, self.ceiling)
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

    def _record(self, rows: list[_Running], logits: torch.Tensor) -> list[SecondPassResult]:
        """Pick each row's token from its logits (B, V); finish (free the row) on the end
        token or the cap."""
        eot = self.checkpoint.spec.eot
        picked = logits.argmax(dim=-1)  # (B,)
        picked_lp = torch.log_softmax(logits, dim=-1).gather(1, picked[:, None])[:, 0]
        done: list[SecondPassResult] = []
        finished_rows: set[int] = set()
        for row, token, lp in zip(rows, picked.tolist(), picked_lp.tolist(), strict=True):
            row.tokens.append(token)
            row.log_prob += lp
            if token == eot or len(row.tokens) == self.max_new_tokens:
                text_tokens = tuple(row.tokens[:-1] if token == eot else row.tokens)
                text = self.checkpoint.tokenizer.decode(text_tokens)
                avg = row.log_prob / (len(text_tokens) + 1)
                done.append(SecondPassResult(row.request_id, text_tokens, text, avg,
                                             row.no_speech_prob))
                self.manager.free_row(row.row_id)
                finished_rows.add(row.row_id)
        known = {r.row_id for r in self._running}
        joined = self._running + [r for r in rows if r.row_id not in known]
        self._running = [r for r in joined if r.row_id not in finished_rows]
        return done

    def abort(self, request_id: int) -> bool:
        """Drop a waiting or running request (its row freed now); False when unknown."""
        for pending in self._waiting:
            if pending.request_id == request_id:
                self._waiting.remove(pending)
                return True
        for row in self._running:
            if row.request_id == request_id:
                self.manager.free_row(row.row_id)
                self._running.remove(row)
                return True
        return False
