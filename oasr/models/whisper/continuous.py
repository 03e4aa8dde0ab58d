"""Continuous batching of Whisper second-pass requests on the paged decoder pool.

Requests (a segment's waveform, or its encoder states) wait in FIFO order; each ``step`` admits
what the pool can reserve (``can_admit`` on each row's declared ceiling), encodes and prefills
the admitted rows together, advances every other running row by one token in ONE batched
decoder call, and returns the requests that finished. Rows join and leave between steps, at
any length; a row's pages are freed the step it finishes.

Every request is decoded under Whisper's safeguards (``oasr.models.whisper.safeguards``): its
rows stop at the token budget of its duration or as soon as they loop, and a first decode that
fails is queued again, ahead of new requests, as the whole fallback ladder at once: sampled
rows at every remaining temperature (0.2 ... 1.0, ``samples_per_temperature`` each), batched
together and with everything else like any rows. The kept decode is the one the reference
decoders' sequential ladder would keep: the likeliest sample of the lowest temperature that
passes, so one extra decode pass costs what one temperature would, not five. A request whose
every temperature fails is answered with the best attempt, flagged ``failed``. Each sampled
row draws from a generator of its own, seeded from the decoder's seed, the request's input
(waveform or encoder states, and prefix) and the row's place in the ladder: the same segment
samples the same fallback text whatever shares its batch, run after run.
"""

from __future__ import annotations

import itertools
import zlib
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from oasr.cache.decoder_kv import PagedDecoderKv
from oasr.models.whisper.beam_pass import beam_attempt, start_beam_search
from oasr.models.whisper.decode_requests import (
    DecodeRequest,
    PendingDecode,
    RunningRow,
    SecondPassResult,
)
from oasr.models.whisper.decoding import (
    BeamSearch,
    accepted_draft,
    default_max_new_tokens,
    draft_tensor,
    no_speech_probs,
    suppression_masks,
)
from oasr.models.whisper.frontend import HOP_LENGTH, N_SAMPLES
from oasr.models.whisper.loader import WhisperCheckpoint
from oasr.models.whisper.logits import best_indices
from oasr.models.whisper.safeguards import DecodeAttempt, best_attempt
from oasr.models.whisper.transcriber import (
    WhisperDecodeConfig,
    build_decoder_manager,
    samples_per_temperature,
)
from oasr.models.whisper.window import EncodedSegments, SegmentEncoder

_SAMPLES_PER_ENCODER_FRAME = 2 * HOP_LENGTH  # the encoder's stride-2 stem: 20 ms


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
        # background refinements (for display, decoded again at the segment's end) take the
        # cheap window: the segment plus 2 s, the rest of the window a silent one's states
        self.refine_encoder = SegmentEncoder(model, self.config.refine_window)
        # the fallback decodes every remaining temperature at once, best_of rows each as far as
        # the row cap allows (at least one row per temperature)
        self.samples_per_temperature = samples_per_temperature(self.config)
        ladder = len(self.config.fallback.temperatures) - 1
        if self.config.max_rows < ladder:
            raise ValueError(
                f"max_rows={self.config.max_rows} cannot hold the fallback ladder ({ladder} "
                f"temperatures decoded at once): raise max_rows to >= {ladder} or use fewer "
                "fallback temperatures")
        self._always, self._first = suppression_masks(spec, model.config.n_vocab, model.device)
        model.decoder.logits.serve(self.config.logits, self.config.beam_size)
        self.seed = seed
        self._waiting: deque[PendingDecode] = deque()  # finals and their fallbacks, FIFO
        self._background: deque[PendingDecode] = deque()  # refinements: when nothing else waits
        self._running: list[RunningRow] = []
        # temperature-0 decodes of urgent requests when the beam is wider than 1 (a batch is
        # searched from start to end within one step: no search outlives it)
        self._search = BeamSearch(model, spec, self.config.beam_size)
        self._row_ids = itertools.count()
        self._view: PagedDecoderKv | None = None  # kept while the running rows stay the same
        self._joining: PagedDecoderKv | None = None  # the last prefill's, until its rows join
        self.num_fallbacks = 0  # first decodes that failed and went down the temperature ladder
        self.num_beam_retries = 0  # greedy fast finals that failed and were beam-searched
        self.num_loops = 0  # rows stopped by the repetition rule
        # asked at each beam step whether a searched request has been aborted since the
        # commands were last taken (its search is then dropped, ``num_cancelled``); the
        # second-pass loop answers from the aborts it has been sent
        self.cancelled: Callable[[int], bool] = _never
        self.num_cancelled = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._background)

    @property
    def num_urgent(self) -> int:
        """Requests waiting that are not background (finals and their fallbacks)."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._background or self._running)

    def word_ends(self, tokens: tuple[int, ...]) -> list[int]:
        """Where each word of ``tokens``' text ends (``WhisperTokenizer.word_ends``)."""
        return self.checkpoint.tokenizer.word_ends(tokens)

    def text_tokens(self, text: str) -> list[int]:
        """``text``'s tokens (to force as a prefix)."""
        return self.checkpoint.tokenizer.encode(text)

    def text_of(self, tokens: tuple[int, ...]) -> str:
        """The text of text tokens."""
        return self.checkpoint.tokenizer.decode(tokens)

    def budget(self, num_samples: int) -> int:
        """Tokens a segment of ``num_samples`` may generate (the token budget, capped)."""
        rule = self.config.token_budget
        return self.max_new_tokens if rule is None else rule.max_tokens(num_samples,
                                                                         self.max_new_tokens)

    def submit(self, request_id: int, waveform: torch.Tensor | np.ndarray,
               prefix: tuple[int, ...] = (), background: bool = False,
               fast: bool = False, draft: tuple[int, ...] = (),
               previous: tuple[int, ...] = ()) -> None:
        """Queue a 16 kHz mono waveform of at most 30 s.

        Args:
            prefix: text tokens forced after the start prompt (the transcript so far, which
                the result then begins with; the budget counts the tokens after it).
            background: decode only when no other request waits, at temperature 0 only (a
                refinement of an open segment; finals go first).
            fast: decode greedily on the segment's own window (as refinements are) instead
                of the configured beam and window: for a busy server, whose second pass would
                otherwise fall behind (the fallback ladder still applies).
            draft: text tokens after the prefix (an earlier decode's transcript of most of
                the audio) for a greedy decode: fed with the prompt in one decoder call and
                taken while each is its own first choice, so its tokens are those it would
                pick one by one (`oasr.models.whisper.decoding.accepted_draft`); a beam
                decode ignores it (taking a draft where the model was fairly sure turned
                beam finals into greedy ones: docs/benchmarks.md).
            previous: text tokens of a previous-text prompt (a stream's hotwords and prompt),
                given after ``<|startofprev|>`` and before the start prompt, as Whisper's
                ``initial_prompt``: the transcript is not forced to contain them, it is
                conditioned on them (ignored by a checkpoint without that token).
        Raises:
            ValueError: the waveform is not 1-D or is longer than one 30 s window, or the
                prefix leaves no room in the decoder's window.
        """
        shape = tuple(waveform.shape)
        if len(shape) != 1 or shape[0] > N_SAMPLES:
            raise ValueError(f"request {request_id}: waveform of shape {shape}; Whisper takes a "
                             f"1-D waveform of at most {N_SAMPLES} samples (30 s)")
        if self.checkpoint.spec.previous is None:
            previous = ()
        room = self.max_new_tokens - len(prefix) - (len(previous) + 1 if previous else 0)
        if room < 1:
            raise ValueError(f"request {request_id}: a prefix of {len(prefix)} tokens leaves no "
                             f"room in the decoder's {self.max_new_tokens} positions")
        request = DecodeRequest(request_id, min(room, self.budget(shape[0])),
                                prefix=tuple(prefix), draft=tuple(draft),
                                previous=tuple(previous),
                                background=background,
                                fast=fast or background,
                                # a refinement never falls back: nothing to seed
                                sample_seed=0 if background else self._sample_seed(
                                    waveform, tuple(previous) + tuple(prefix)))
        (self._background if background else self._waiting).append(
            PendingDecode(request, waveform=waveform))

    def submit_encoded(self, request_id: int, encoded: torch.Tensor,
                       num_samples: int | None = None, draft: tuple[int, ...] = (),
                       previous: tuple[int, ...] = ()) -> None:
        """Queue encoder states (S, d) computed elsewhere; the token budget comes from
        ``num_samples`` (default: the audio all S frames stand for); ``draft`` and
        ``previous`` as `submit`'s."""
        samples = encoded.size(0) * _SAMPLES_PER_ENCODER_FRAME if num_samples is None else num_samples
        states = EncodedSegments(encoded[None], (encoded.size(0),))
        if self.checkpoint.spec.previous is None:
            previous = ()
        room = self.max_new_tokens - (len(previous) + 1 if previous else 0)
        self._waiting.append(PendingDecode(DecodeRequest(
            request_id, min(room, self.budget(samples)), states, draft=tuple(draft),
            previous=tuple(previous), sample_seed=self._sample_seed(encoded, tuple(previous)))))

    def _sample_seed(self, data: torch.Tensor | np.ndarray, prefix: tuple[int, ...]) -> int:
        """The seed of a request's sampled rows: a checksum of the decoder's seed, its input
        and its prefix."""
        values = data.detach().float().cpu().numpy() if isinstance(data, torch.Tensor) else data
        crc = zlib.crc32(np.asarray([self.seed], dtype=np.int64).tobytes())
        crc = zlib.crc32(np.ascontiguousarray(values, dtype=np.float32).tobytes(), crc)
        return zlib.crc32(np.asarray(prefix, dtype=np.int64).tobytes(), crc)

    @torch.inference_mode()
    def step(self) -> list[SecondPassResult]:
        """Beam-search the waiting first decodes (``beam_size`` > 1), then admit, prefill the
        admitted, advance the others by one token; the finished."""
        finished = self._beam_step() if self.config.beam_size > 1 else []
        stepping = list(self._running)
        finished += self._advance(stepping) if stepping else []
        admitted = self._admit()
        if admitted:
            finished += self._prefill(admitted)
        return finished

    def _beam_step(self) -> list[SecondPassResult]:
        """The waiting temperature-0 decodes (up to ``max_rows`` of one prompt shape) beam-
        searched together to their ends in this step; before each token the searched requests
        that have been aborted meanwhile (``cancelled``) leave the search (``num_cancelled``).
        Each request then passes, or waits for its sampled fallback."""
        searched = self._start_beams()
        done = []
        try:
            while self._search.num_groups:
                for request_id in [r for r in searched if self.cancelled(r)]:
                    del searched[request_id]  # aborted while its search ran
                    self._search.drop(request_id)
                    self.num_cancelled += 1
                for key, hyp in self._search.step():
                    request = searched.pop(key)  # type: ignore[call-overload]
                    request.samples, request.num_rows = [], 1
                    result = self._settle(request, beam_attempt(self.checkpoint, self.config,
                                                                request, hyp))
                    if result is not None:
                        done.append(result)
        except BaseException:  # the requests are lost (the loop answers them as failed)
            self._search.clear()
            raise
        return done

    def _start_beams(self) -> dict[int, DecodeRequest]:
        """The waiting first decodes of one prompt shape, up to ``max_rows``, encoded and
        started as one search; its requests by id. Finals that arrive meanwhile wait for the
        next one: joining a running search, or stepping it between other rows, was measured
        slower (docs/benchmarks.md)."""
        firsts = [p for p in self._waiting if self._beamed(p.request)]
        if not firsts:
            return {}
        shape = self._shape(firsts[0].request)  # one prompt shape per search
        batch = [p for p in firsts if self._shape(p.request) == shape][: self.config.max_rows]
        for p in batch:
            self._waiting.remove(p)
        wanted = [p for p in batch if not self.cancelled(p.request.request_id)]
        self.num_cancelled += len(batch) - len(wanted)  # aborted before they were encoded
        if not wanted:
            return {}
        self._encode(wanted)
        requests = [p.request for p in wanted]
        start_beam_search(self._search, self.encoder, self.config, requests,
                          [self._prompt(r) for r in requests], start=shape[0])
        return {r.request_id: r for r in requests}

    def _prompt(self, request: DecodeRequest) -> tuple[int, ...]:
        """The request's decoder prompt: ``<|startofprev|>`` and its previous-text prompt
        (if any), the start prompt, its forced prefix."""
        spec = self.checkpoint.spec
        before = (spec.previous, *request.previous) if request.previous else ()
        return before + spec.prompt + request.prefix  # type: ignore[return-value]

    @staticmethod
    def _shape(request: DecodeRequest) -> tuple[int, int]:
        """(where the start prompt begins, prefix length): requests decoded together share
        it, so their start token and their first generated position line up."""
        return (len(request.previous) + 1 if request.previous else 0), len(request.prefix)

    def _row_temperatures(self, request: DecodeRequest) -> list[float]:
        """The temperature of each row of the request's next decode: one row for the first
        decode; for the fallback, every remaining temperature of the ladder at once, with
        ``samples_per_temperature`` rows each."""
        temperatures = self.config.fallback.temperatures
        if request.temperature_index == 0:
            return [temperatures[0]]
        return [t for t in temperatures[1:] for _ in range(self.samples_per_temperature)]

    def _rows_for(self, request: DecodeRequest) -> int:
        return len(self._row_temperatures(request))

    def _admit(self) -> list[PendingDecode]:
        """Requests to prefill this step, urgent ones first, all of one prompt length, as many
        as the row cap and the pool's reservations allow."""
        admitted: list[PendingDecode] = []
        ceilings: list[int] = []
        urgent = [p for p in self._waiting if not self._beamed(p.request)]
        for pending in urgent or ([] if self._waiting else list(self._background)):
            request = pending.request
            if admitted and self._shape(request) != self._shape(admitted[0].request):
                break
            rows = self._rows_for(request)
            wanted = ceilings + [len(self._prompt(request)) + request.max_new_tokens] * rows
            if len(self._running) + len(wanted) > self.config.max_rows:
                break
            if not self.manager.can_admit(wanted).ok:
                break
            ceilings = wanted
            admitted.append(pending)
            (self._background if request.background else self._waiting).remove(pending)
        return admitted

    def _retried_by_beam(self, request: DecodeRequest) -> bool:
        """A fast final's greedy decode that fails the fallback rule is beam-searched next
        (when the beam is wider than 1), before the temperature ladder."""
        return (request.fast and not request.background and self.config.beam_size > 1
                and request.temperature_index == 0 and len(self.config.fallback.temperatures) > 1)

    def _beamed(self, request: DecodeRequest) -> bool:
        """Decoded by the batched beam search: a first decode of an urgent request when the
        beam is wider than 1 (background refinements stay greedy: they are for display)."""
        return (self.config.beam_size > 1 and request.temperature_index == 0
                and not request.fast)

    def _encode(self, pending: list[PendingDecode]) -> None:
        """Encode the admitted requests that arrived as waveforms (one batched call)."""
        for encoder, fast in ((self.encoder, False), (self.refine_encoder, True)):
            fresh = [p for p in pending
                     if p.request.encoded is None and p.request.fast == fast]
            if not fresh:
                continue
            encoded = encoder.encode([p.waveform for p in fresh if p.waveform is not None])
            for row, p in enumerate(fresh):
                p.request.encoded = EncodedSegments(encoded.states[row : row + 1],
                                                    (encoded.num_encoded[row],))
                if self._retried_by_beam(p.request):
                    p.request.waveform = p.waveform
                p.waveform = None

    def _prefill(self, admitted: list[PendingDecode]) -> list[SecondPassResult]:
        model, spec = self.checkpoint.model, self.checkpoint.spec
        self._encode(admitted)
        rows: list[RunningRow] = []
        for p in admitted:
            temperatures = self._row_temperatures(p.request)
            p.request.num_rows, p.request.samples = len(temperatures), []
            rows += [RunningRow(p.request, next(self._row_ids), t,
                                generator=self._row_generator(p.request, k) if t else None)
                     for k, t in enumerate(temperatures)]
        states = [r.request.encoded for r in rows]
        encoded = EncodedSegments(torch.cat([s.states for s in states if s is not None]),
                                  tuple(s.num_encoded[0] for s in states if s is not None))
        # a temperature-0 row's draft: fed with its prompt, taken where greedy would pick it;
        # every row holds the padded drafts, so none is longer than the smallest budget allows
        most = min(r.request.max_new_tokens for r in rows) - 1
        drafts = [r.request.draft[:most]
                  if r.temperature == 0 and r.request.temperature_index == 0 else ()
                  for r in rows]
        guess = draft_tensor(drafts, spec.eot, model.device)
        try:
            for row in rows:
                self.manager.allocate_row(row.row_id,
                                          len(self._prompt(row.request)) + row.request.max_new_tokens)
            if (self.manager.shared_tail is None
                    and min(encoded.num_encoded) < model.config.n_audio_ctx):
                self.manager.set_shared_tail(self.encoder.silence_tail_kv())
            # the rows' frames up to the longest one's encoded in their pages; the silent
            # window's after them are read once for all rows (`PagedDecoderKv.attend_cross`)
            self.manager.build_cross_kv([r.row_id for r in rows], self.encoder.own_cross_kv(encoded))
            prompt = torch.tensor([list(self._prompt(r.request)) for r in rows],
                                  device=model.device)  # (B, P), one length per step
            view = self.manager.view([r.row_id for r in rows])
            prompt_logits = model.decoder(torch.cat([prompt, guess], dim=1), view)  # (B, P+D, V)
        except Exception:  # the requests are dropped; their pages must not leak
            for row in rows:
                if self.manager.has_row(row.row_id):
                    self.manager.free_row(row.row_id)
            raise
        start, prefix_len = self._shape(rows[0].request)
        for row, prob in zip(rows, no_speech_probs(prompt_logits, spec, start), strict=True):
            row.no_speech_prob = prob
        width = prompt.size(1)
        first = self._first if prefix_len == 0 else self._always
        runs, draft_log_probs = accepted_draft(prompt_logits[:, width - 1:], guess, drafts,
                                               first, self._always)
        taken = runs.tolist()
        for index, (row, run) in enumerate(zip(rows, taken, strict=True)):
            if guess.size(1):
                self.manager.truncate(row.row_id, width + run)
            row.tokens = list(drafts[index][:run])
            row.token_log_probs = draft_log_probs[index, :run].tolist()
            row.log_prob = float(sum(row.token_log_probs))
        after = prompt_logits[torch.arange(len(rows)), width - 1 + runs]  # (B, V)
        masks = torch.stack([first if run == 0 else self._always for run in taken])
        done = self._record(rows, after + masks)
        running = {r.row_id for r in self._running}
        # the rows' cross K/V this prefill gathered, for the step they join the batch
        self._joining = view if any(r.row_id in running for r in rows) else None
        return done

    def _row_generator(self, request: DecodeRequest, place: int) -> torch.Generator:
        """The generator of the request's ``place``-th sampled row of its ladder (seeded with
        32 bits: torch's CPU generator keeps no more of a seed)."""
        seed = zlib.crc32(np.asarray([request.sample_seed, place], dtype=np.int64).tobytes())
        return torch.Generator(device=self.checkpoint.model.device).manual_seed(seed)

    def _advance(self, rows: list[RunningRow]) -> list[SecondPassResult]:
        model = self.checkpoint.model
        last = torch.tensor([[r.tokens[-1]] for r in rows], device=model.device)  # (B, 1)
        row_ids = [r.row_id for r in rows]
        view, joining, self._joining = self._view, self._joining, None
        if view is None or view.row_ids != row_ids:  # the batch changed
            held = {row_id: i for i, row_id in enumerate(view.row_ids)} if view else {}
            parts = [v for v in (view, joining) if v is not None]
            known = {row_id for part in parts for row_id in part.row_ids}
            if view is not None and all(row_id in held for row_id in row_ids):
                view.select([held[row_id] for row_id in row_ids])  # rows left: no new gather
            elif known.issuperset(row_ids):
                # rows just prefilled joined: their prefill's reads and the others' are kept
                view = self._view = PagedDecoderKv.joined(parts, row_ids)
            else:
                view = self._view = self.manager.view(row_ids)
        return self._record(rows, model.decoder(last, view)[:, -1] + self._always)

    def _pick(self, rows: list[RunningRow], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Each row's next token from its logits (B, V): argmax at temperature 0, else sampled
        from softmax(logits / T); with the token's log-probability under the plain logits."""
        picked = best_indices(logits)  # (B,)
        hot = [i for i, r in enumerate(rows) if r.temperature > 0]
        if hot:
            scale = torch.tensor([rows[i].temperature for i in hot], device=logits.device)
            probs = torch.softmax(logits[hot].float() / scale[:, None], dim=-1)  # (H, V)
            for j, i in enumerate(hot):  # each row from its own generator
                picked[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
        picked_lp = torch.log_softmax(logits.float(), dim=-1).gather(1, picked[:, None])[:, 0]
        return picked.tolist(), picked_lp.tolist()

    def _record(self, rows: list[RunningRow], logits: torch.Tensor) -> list[SecondPassResult]:
        """Append each row's next token; finish rows (free them) on the end token, the budget
        or a loop, and requests whose decode is complete."""
        eot = self.checkpoint.spec.eot
        repetition = self.config.repetition
        done: list[SecondPassResult] = []
        finished_rows: set[int] = set()
        for row, token, lp in zip(rows, *self._pick(rows, logits), strict=True):
            row.tokens.append(token)
            row.log_prob += lp
            row.token_log_probs.append(lp)
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

    def _finish_row(self, row: RunningRow, looped: bool, truncated: bool) -> SecondPassResult | None:
        """Record a finished row's decode; the request's result once it has one to give."""
        eot = self.checkpoint.spec.eot
        tokens = tuple(row.tokens[:-1] if row.tokens[-1] == eot else row.tokens)
        request = row.request
        request.samples.append(request.attempt(self.checkpoint.tokenizer, tokens,
                                               row.temperature, row.log_prob,
                                               row.no_speech_prob, looped, truncated,
                                               row.token_log_probs))
        if len(request.samples) < request.num_rows:
            return None  # other rows of this decode still running
        if request.temperature_index == 0:
            return self._settle(request, request.samples[0])
        # the ladder: per temperature its likeliest sample; the first that passes is kept, as
        # if the temperatures had been tried one after the other
        rule = self.config.fallback
        for temperature in rule.temperatures[1:]:
            samples = [a for a in request.samples if a.temperature == temperature]
            request.attempts.append(max(samples, key=lambda a: a.avg_log_prob))
            if not rule.is_failed(request.attempts[-1]):
                break
        return self._result(request)

    def _settle(self, request: DecodeRequest, attempt: DecodeAttempt) -> SecondPassResult | None:
        """The first decode of ``request`` is complete: its result, or None when the fallback
        ladder was queued (ahead of new requests)."""
        request.attempts.append(attempt)
        rule = self.config.fallback
        waveform, request.waveform = request.waveform, None
        if rule.is_failed(attempt) and waveform is not None:
            # a busy server's greedy final that failed: beam-searched as finals otherwise are
            # (its window encoded again), before any sampling: the ladder's rows, every
            # temperature's samples, would run beside the other finals' rows, and the most
            # uncertain of them run to the token budget, for every row's step
            request.fast, request.encoded = False, None
            self.num_beam_retries += 1
            self._waiting.appendleft(PendingDecode(request, waveform=waveform))
            return None
        if (rule.is_failed(attempt) and not request.background
                and len(rule.temperatures) > 1):
            request.temperature_index = 1
            self.num_fallbacks += 1
            self._waiting.appendleft(PendingDecode(request))
            return None
        return self._result(request)

    def _result(self, request: DecodeRequest) -> SecondPassResult:
        """The request's result from its attempts: the last one if it passed, else the best
        of all (flagged ``failed``)."""
        rule = self.config.fallback
        last = request.attempts[-1]
        failed = rule.is_failed(last)
        kept = best_attempt(request.attempts, rule) if failed else last
        return SecondPassResult(request.request_id, kept.tokens, kept.text, kept.avg_log_prob,
                                request.attempts[0].no_speech_prob, kept.temperature,
                                len(request.attempts), failed, kept.looped,
                                kept.token_log_probs)

    def abort(self, request_id: int) -> bool:
        """Drop a waiting or running request (its rows freed now); False when unknown."""
        found = False
        for queue in (self._waiting, self._background):
            for pending in list(queue):
                if pending.request.request_id == request_id:
                    queue.remove(pending)
                    found = True
        for row in list(self._running):
            if row.request.request_id == request_id:
                self.manager.free_row(row.row_id)
                self._running.remove(row)
                found = True
        return found


def _never(request_id: int) -> bool:
    return False
