"""`GpuStreamingDecoder`: batched streaming CTC decoding (greedy or prefix beam search)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from oasr.decoding.compiled_search import SearchTables, beam_chunk_compiled, ensure_compiled
from oasr.decoding.config import DecoderConfig, Hypothesis
from oasr.decoding.context import ContextBatch, ContextGraph, ContextStore
from oasr.decoding.lm_fusion import LmFusion
from oasr.decoding.partial_text import PartialTexts
from oasr.decoding.search import beam_chunk, greedy_chunk, prepare_chunk, update_frame_stats
from oasr.decoding.state import (
    HOST_FIELDS,
    NEG_INF,
    TENSOR_FIELDS,
    DecoderState,
    ensure_capacity,
    new_state,
    reset_in_place,
    split_into,
    stack_states,
)
from oasr.decoding.state_rows import StateRows
from oasr.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from oasr.lm import CharNgramLm, DecoderLm

WORD_BOUNDARY = "\u2581"


@dataclass(frozen=True)
class FrameStats:
    """A row's endpointing inputs, read back to the host.

    Attributes:
        num_frames: encoder frames decoded since the last reset.
        num_trailing_blank_frames: frames since the last frame whose argmax was not blank.
        has_speech: whether any frame since the reset had a non-blank argmax.
    """

    num_frames: int
    num_trailing_blank_frames: int
    has_speech: bool


@dataclass(frozen=True)
class StreamStep:
    """What one decoding step of one stream produced, read back in the step's one transfer.

    Attributes:
        hypothesis: the stream's current best hypothesis (the partial result).
        stats: its endpointing inputs.
    """

    hypothesis: Hypothesis
    stats: FrameStats


_INT32, _FLOAT32 = struct.Struct("<i"), struct.Struct("<f")


def _cols(buffer: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` columns (last axis) of a (..., capacity) buffer, zero-padded if it
    is narrower."""
    part = buffer[..., :width]
    if part.shape[-1] == width:
        return part
    return torch.nn.functional.pad(part, (0, width - part.shape[-1]))



@dataclass(frozen=True)
class GpuDecoderConfig(DecoderConfig):
    """A `DecoderConfig` that builds its own decoder (`build_decoder`).

    The settings live in `DecoderConfig` so the search modules can read them without the
    decoder; the factory lives here, beside the decoder it builds. `oasr.cache`'s
    `CtcStateCacheManager` calls it when it is handed a config (``CtcStateCacheManager(
    GpuDecoderConfig(beam_size=10))``): the cache layer sits below decoding and never
    imports it.
    """

    def build_decoder(self, tokenizer: Tokenizer | None = None,
                      device: torch.device | str | None = None) -> GpuStreamingDecoder:
        """A `GpuStreamingDecoder` running this config."""
        return GpuStreamingDecoder(self, tokenizer, device)


class GpuStreamingDecoder:
    """Decodes CTC log-probs chunk by chunk for many streams at once, on any torch device.

    The decoder holds only its config, tokenizer and a memo of the partials' texts
    (`PartialTexts`); all search state lives in `DecoderState` objects it creates, so one
    decoder serves every stream (the cache layer pools the states).

    Two levels of calls use the states (besides `create_state` / `reset_state`):
    - per stream, the specification's API (`oasr.cache.StreamHandle` wraps it):
      `decode_chunk` advances one state (of B rows), `partial` reads a row's best
      hypothesis, `finalize_stream` its n-best;
    - batched, the engine's step: `decode_streams` advances many states with one search,
      `partials` reads back every stream's best hypothesis and endpointing inputs in one
      transfer.
    Batch-1 states live as rows of one persistent storage (`StateRows`), so a batched step
    gathers the cohort's rows, searches and writes them back: a fixed number of kernels per
    step, whatever the number of streams. States from elsewhere (``new_state``, multi-row
    states) are stacked and split instead.

    With a char LM (beam search only) hypotheses rank by acoustic + fused LM score (see
    `oasr.decoding.lm_fusion`); `finalize_stream` also scores the sentence end, and the
    hypotheses' ``score`` is that fused score. A state's hotwords (`set_context`, beam search
    only) join the fused score the same way (`oasr.decoding.context`).
    """

    def __init__(
        self,
        config: DecoderConfig | None = None,
        tokenizer: Tokenizer | None = None,
        device: torch.device | str | None = None,
        lm: CharNgramLm | DecoderLm | None = None,
        rows: int | None = None,
        max_segment_frames: int | None = None,
    ) -> None:
        """
        Args:
            rows: batch-1 states this decoder holds at once (the engine's stream slots). With
                ``max_segment_frames``, their storage is allocated here for good: rows
                ``0 .. rows - 1``, never grown. None: 8 rows that grow as states are made.
            max_segment_frames: the most frames a state decodes between resets (at most one
                token each): its token buffers, allocated here, never grow, and a state that
                would pass it is an error (`RuntimeError`). None: buffers of
                ``initial_token_capacity`` that double when full.
        Raises:
            ValueError: ``rows`` or ``max_segment_frames`` below 1; a tokenizer or LM whose
                blank id is not the config's; an LM with greedy search.
        """
        for name, value in (("rows", rows), ("max_segment_frames", max_segment_frames)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"GpuStreamingDecoder {name} must be an int >= 1, got {value!r}")
        self._config = config if config is not None else GpuDecoderConfig()
        self.tokenizer = tokenizer
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if tokenizer is not None and tokenizer.blank_id != self._config.blank_id:
            raise ValueError(
                f"tokenizer blank id {tokenizer.blank_id} != "
                f"config.blank_id {self._config.blank_id}"
            )
        self._fusion: LmFusion | None = None
        if lm is None:
            self._config = self._config.resolved()
        else:
            from oasr.lm import as_decoder_lm

            if self._config.is_greedy:
                raise ValueError("a char LM needs beam search: set beam_size > 1 (or drop the LM)")
            lm = as_decoder_lm(lm)
            self._config = cfg = self._config.resolved(lm.fusion_defaults)
            units = lm.units
            if lm.blank_id != cfg.blank_id:
                raise ValueError(f"LM blank id {lm.blank_id} != config.blank_id {cfg.blank_id}")
            boundary = units.index(WORD_BOUNDARY) if WORD_BOUNDARY in units else None
            self._fusion = LmFusion.build(lm, cfg, self.device, boundary)
        cfg = self._config
        # the LM tables as the compiled search takes them (None: the tensor search runs)
        self._search_tables = (SearchTables.build(self._fusion)
                               if cfg.runs_compiled_search(self.device.type) else None)
        if self._search_tables is not None:
            ensure_compiled()
        fixed = max_segment_frames is not None
        self._rows = StateRows(
            cfg.beam_size,
            max_segment_frames + 1 if max_segment_frames is not None else cfg.initial_token_capacity,
            cfg.blank_id, self.device, num_rows=rows or 8, fixed=fixed)
        self._texts = PartialTexts()  # each stream's last partial text, extended as it grows
        self._contexts: ContextStore | None = None  # the states' hotword graphs (set_context)

    @property
    def config(self) -> DecoderConfig:
        return self._config

    @property
    def has_lm(self) -> bool:
        return self._fusion is not None

    @property
    def has_word_lm(self) -> bool:
        return self._fusion is not None and self._fusion.word is not None

    def create_state(self, batch: int, vocab_size: int, row: int | None = None) -> DecoderState:
        """A fresh state of ``batch`` rows for a ``vocab_size``-token model.

        A batch-1 state is row ``row`` of the decoder's persistent storage (the engine passes
        the stream's slot; None takes the lowest free row) and holds it until `free_state`.
        A state of more rows owns its tensors.

        Raises:
            ValueError: ``row`` is held by another state, or given with ``batch`` > 1.
        """
        self._check_vocab(vocab_size)
        if batch == 1:
            return self._rows.attach(row)
        if row is not None:
            raise ValueError(f"a {batch}-row state owns its tensors: it takes no storage row")
        return self._owned_state(batch)

    def free_state(self, state: DecoderState) -> None:
        """Give a batch-1 state's storage row back for the next state made there (call it on
        the thread that decodes). A state that owns its tensors holds nothing to give back.

        Raises:
            ValueError: the state's row was already freed (a double free).
        """
        if state.pool_row is not None:
            self._rows.release(state)
        if state.context is not None and self._contexts is not None:
            self._contexts.remove(state.context)
            state.context = None

    def set_context(self, state: DecoderState, graph: ContextGraph | None) -> None:
        """Search ``state``'s rows with hotword ``graph`` from the next chunk on (None: none).

        The partial credit of a match in progress under the old graph is taken back, and
        each hypothesis starts the new graph at a word start when its prefix is empty or
        ends with the word-boundary unit, else inside a word. The graph stays through
        `reset_state`, until `free_state` or another call here.

        Raises:
            ValueError: greedy search (hotwords need beam search), or a graph built for
                another vocabulary.
        """
        if graph is not None and self._config.is_greedy:
            raise ValueError("hotwords need beam search: set beam_size > 1")
        if self._contexts is None:
            if graph is None:
                return
            self._contexts = ContextStore(graph.vocab_size, self.device)
        old = state.context
        if graph is not None:
            self._contexts.add(graph)
        if old is not None:
            pending = old.tables(self.device)["pending"]
            state.lm_score.sub_(pending[state.ctx_state])
            self._contexts.remove(old)
        state.context = graph
        start = torch.zeros_like(state.ctx_state)
        if graph is not None and graph.boundary_id is not None:
            at_word = (state.prefix_len == 0) | (state.last_token == graph.boundary_id)
            start = torch.where(at_word, start, 1)  # 1: inside a word (`context.MID_WORD`)
        state.ctx_state.copy_(start)

    def _context_batch(self, states: Sequence[DecoderState]) -> ContextBatch | None:
        """The hotword graphs of the rows of ``states`` (None when none has any)."""
        if self._contexts is None or not self._contexts.in_use:
            return None
        return self._contexts.batch([s.context for s in states for _ in range(s.batch_size)])

    def _owned_state(self, batch: int) -> DecoderState:
        """A fresh ``batch``-row state that owns its tensors (not a row of the storage)."""
        cfg = self._config
        return new_state(
            batch, cfg.beam_size, cfg.initial_token_capacity, cfg.blank_id, self.device
        )

    def reset_state(self, state: DecoderState, batch: int, vocab_size: int) -> None:
        """Rewind ``state`` to a fresh one in place (buffers reused; rebuilt if batch differs)."""
        self._check_vocab(vocab_size)
        if state.batch_size != batch or state.beam_size != self._config.beam_size:
            if self._rows.holds(state):
                self._rows.detach(state)
            fresh = self._owned_state(batch)
            fresh.context = state.context  # hotwords outlive a reset
            for name in TENSOR_FIELDS + HOST_FIELDS:
                setattr(state, name, getattr(fresh, name))
            return
        reset_in_place(state, self._config.blank_id)

    def decode_chunk(
        self, log_probs: torch.Tensor, state: DecoderState, lengths: torch.Tensor | None = None
    ) -> None:
        """Advance every row of ``state`` by one chunk (`decode_streams` of one state).

        Args:
            log_probs: (B, T, V) CTC log-probs, B = the state's rows.
            lengths: (B,) int valid frames per row (the rest is padding), None when all T are
                valid. A CPU tensor is best, even when decoding on CUDA: it is checked on the
                host and lets the search skip padding masks when every row is full.
        """
        self.decode_streams(log_probs, [state], lengths)

    def checkpoint(self, states: Sequence[DecoderState],
                   num_frames: int | None = None) -> Callable[[], None]:
        """A way back for ``states``: calling the result puts them as they are now.

        The engine takes one before a cohort's decode, so a chunk that fails after its search
        (reading the partials back, deciding endpoints) leaves every stream's decoder state
        as it was before the chunk. States that are rows of the storage are copied with one
        gather per field (of the token buffers, the columns a search of ``num_frames`` frames
        can change; None: all of them); others are cloned.
        """
        states = list(states)
        bounds = [s.max_len_bound for s in states]
        rows = self._rows.rows_of(states)
        if rows is not None:
            index = self._rows.index(rows)
            width = None if num_frames is None else max(bounds, default=0) + num_frames + 1
            saved = self._rows.gather(index, max(bounds, default=0), width)

            def restore() -> None:
                self._rows.scatter(index, saved)
                for state, bound in zip(states, bounds, strict=True):
                    state.max_len_bound = bound
            return restore
        copies = [{n: getattr(s, n).clone() for n in TENSOR_FIELDS} for s in states]

        def restore_owned() -> None:
            for state, fields_, bound in zip(states, copies, bounds, strict=True):
                for name, value in fields_.items():
                    setattr(state, name, value)
                state.max_len_bound = bound
        return restore_owned

    def decode_streams(
        self,
        log_probs: torch.Tensor,
        states: Sequence[DecoderState],
        lengths: torch.Tensor | None = None,
    ) -> None:
        """Advance B streams, one state each, with one batched search.

        Args:
            log_probs: (B, T, V); rows are taken from ``states`` in order (each state holds
                one row, or several).
            states: the states; a state may appear at most once.
            lengths: (B,) valid frames per row, None when all T are valid (CPU tensor
                preferred, see `decode_chunk`).
        """
        states = list(states)
        if not states:
            raise ValueError("decode_streams needs at least one state")
        rows = self._rows.rows_of(states)
        if rows is None:  # some states own their tensors: stack, search, split
            self._search_stacked(log_probs, states, lengths)
            return
        if log_probs.dim() != 3:
            raise ValueError(f"log_probs must be (B, T, V), got shape {tuple(log_probs.shape)}")
        index = self._rows.index(rows)  # (B,)
        self._rows.ensure_capacity(states, index, log_probs.shape[1])
        bound = max(s.max_len_bound for s in states)
        # only the columns this chunk can touch: the prefixes, one per frame, a scratch one
        work = self._rows.gather(index, bound, bound + log_probs.shape[1] + 1)
        self._search(log_probs, work, lengths, self._context_batch(states))
        self._rows.scatter(index, work)
        for state in states:
            state.max_len_bound = work.max_len_bound

    def _search_stacked(
        self, log_probs: torch.Tensor, states: list[DecoderState], lengths: torch.Tensor | None
    ) -> None:
        """`decode_streams` for states that are not all rows of the storage."""
        context = self._context_batch(states)
        if len(states) == 1:
            self._search(log_probs, states[0], lengths, context)
            return
        stacked = stack_states(states)
        self._search(log_probs, stacked, lengths, context)
        split_into(stacked, states)
        for state in states:
            if self._rows.holds(state):
                self._rows.write_back(state)

    def _search(
        self, log_probs: torch.Tensor, state: DecoderState, lengths: torch.Tensor | None,
        context: ContextBatch | None = None,
    ) -> None:
        """One chunk of search on a state that owns its tensors (or a gathered work state);
        ``context``: its rows' hotword graphs."""
        chunk = prepare_chunk(log_probs, lengths, state, self._config)
        if log_probs.shape[1] == 0:
            return
        ensure_capacity(state, log_probs.shape[1])
        if self._config.is_greedy:
            greedy_chunk(chunk, state, self._config.blank_id)
        elif self._search_tables is not None:
            beam_chunk_compiled(chunk, state, self._config, self._search_tables, context)
        else:
            beam_chunk(chunk, state, self._config, self._fusion, context)
        update_frame_stats(chunk, state, self._config.blank_id)
        state.max_len_bound += log_probs.shape[1]

    def partials(self, states: Sequence[DecoderState], row: int = 0) -> list[StreamStep]:
        """The best hypothesis and endpointing inputs of ``row`` of each state, read back to
        the host in one transfer for all of them."""
        return self._read_back(list(states), row)

    def partial(self, state: DecoderState, row: int = 0) -> Hypothesis:
        """The current best hypothesis of ``row`` (cheap: one small device-to-host copy)."""
        return self._read_back([state], row)[0].hypothesis

    def _stacked_rows(self, states: list[DecoderState], row: int) -> Callable[..., torch.Tensor]:
        """A reader of field ``name`` at ``row`` of every state, stacked to (N, ...) (token
        buffers cut or zero-padded to ``width`` columns): one gather from the storage when
        the states are its rows, else one stack."""
        rows = self._rows.rows_of(states) if row == 0 else None
        index = self._rows.index(rows) if rows is not None else None

        def read(name: str, width: int | None = None) -> torch.Tensor:
            if index is not None:
                field = getattr(self._rows.storage, name)
                if width is not None:
                    field = field[..., :width]
                picked = field.index_select(0, index)
                return picked if width is None else _cols(picked, width)
            parts = [getattr(s, name)[row] for s in states]
            return torch.stack(parts if width is None else [_cols(p, width) for p in parts])

        return read

    def _read_back(self, states: list[DecoderState], row: int) -> list[StreamStep]:
        """Best hypothesis and frame stats of ``row`` of each state, in one transfer.

        Also tightens each batch-1 state's host bound on its prefix lengths to the exact
        value, so the next chunks need no capacity check on the device.
        """
        self._check_row(states, row)
        read = self._stacked_rows(states, row)
        total = torch.logaddexp(read("log_pb"), read("log_pnb"))  # (N, K) float32
        if self._fusion is not None or (self._contexts is not None and self._contexts.in_use):
            total = total + read("lm_score")
        best = total.argmax(dim=1, keepdim=True)  # (N, 1)
        width = max(1, max(s.max_len_bound for s in states))
        pick = best[:, :, None].expand(-1, 1, width)  # (N, 1, width)
        prefix_len = read("prefix_len")  # (N, K)
        columns = [
            total.gather(1, best).view(torch.int32),  # the float32 score's bits
            prefix_len.gather(1, best), prefix_len.amax(dim=1, keepdim=True),
            read("num_frames")[:, None], read("num_trailing_blank_frames")[:, None],
            read("has_speech")[:, None],
            read("tokens", width).gather(1, pick)[:, 0],
            read("token_frames", width).gather(1, pick)[:, 0],
        ]
        packed = torch.cat([c.long() for c in columns], dim=1).cpu().numpy()  # (N, 6 + 2 width)
        steps = []
        # each row's prefix to Python alone: the rows are padded to the longest prefix
        for i, (state, line) in enumerate(zip(states, packed[:, :6].tolist(), strict=True)):
            n = line[1]
            if state.batch_size == 1:
                state.max_len_bound = line[2]
            score = _FLOAT32.unpack(_INT32.pack(line[0]))[0]
            hyp = self._hypothesis(packed[i, 6 : 6 + n].tolist(), score,
                                   packed[i, 6 + width : 6 + width + n].tolist(), (state, row))
            steps.append(StreamStep(hyp, FrameStats(line[3], line[4], bool(line[5]))))
        return steps

    def finalize_stream(self, state: DecoderState, row: int = 0) -> list[Hypothesis]:
        """The n-best hypotheses of ``row``, best first (``config.num_best`` at most).

        Never empty: if no hypothesis has a finite score (log-probs that were all -inf or NaN),
        the first one is returned with that score.
        """
        self._check_row([state], row)
        total_t = torch.logaddexp(state.log_pb[row], state.log_pnb[row])  # (K,)
        if self._fusion is not None:
            total_t = total_t + state.lm_score[row] + self._fusion.end_scores(
                state.lm_state[row], state.word_state[row], state.prev_word[row])
        elif self._contexts is not None and self._contexts.in_use:
            total_t = total_t + state.lm_score[row]
        if state.context is not None:  # a hotword at the end is complete, a partial one not
            end_gains = state.context.tables(self.device)["end_gains"]
            total_t = total_t + end_gains[state.ctx_state[row]]
        total = total_t.cpu().tolist()
        lengths = state.prefix_len[row].cpu().tolist()
        tokens = state.tokens[row].cpu().tolist()
        frames = state.token_frames[row].cpu().tolist()
        order = sorted(range(len(total)), key=lambda k: -total[k])
        live = [k for k in order if total[k] > NEG_INF] or order[:1]
        return [
            self._hypothesis(tokens[k][: lengths[k]], total[k], frames[k][: lengths[k]])
            for k in live[: self._config.num_best]
        ]

    def _hypothesis(self, tokens: list[int], score: float, times: list[int],
                    partial_of: tuple[DecoderState, int] | None = None) -> Hypothesis:
        """``partial_of``: the (state, row) of a partial, whose text is memoised."""
        text, tok = "", self.tokenizer
        if tok is not None:
            text = self._texts.text(tok, *partial_of, tokens) if partial_of else tok.decode(tokens)
        return Hypothesis(tokens=tokens, text=text, score=float(score), timestamps=times)

    def _check_vocab(self, vocab_size: int) -> None:
        if self._fusion is not None and self._fusion.vocab_size != vocab_size:
            raise ValueError(f"the LM has {self._fusion.vocab_size} units, the model "
                             f"{vocab_size}")
        if not 0 <= self._config.blank_id < vocab_size:
            raise ValueError(
                f"blank_id {self._config.blank_id} is outside a vocabulary of {vocab_size}"
            )

    def _check_row(self, states: list[DecoderState], row: int) -> None:
        for s in states:
            self._rows.holds(s)  # raises for a freed state
            if not 0 <= row < s.batch_size:
                raise IndexError(f"row {row} out of range for a state of {s.batch_size} rows")
