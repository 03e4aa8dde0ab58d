"""`GpuStreamingDecoder`: batched streaming CTC decoding (greedy or prefix beam search)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.decoding.config import GpuDecoderConfig, Hypothesis
from oasr.decoding.search import beam_chunk, greedy_chunk, prepare_chunk, update_frame_stats
from oasr.decoding.state import (
    NEG_INF,
    DecoderState,
    ensure_capacity,
    new_state,
    reset_in_place,
    split_into,
    stack_states,
)
from oasr.decoding.tokenizer import Tokenizer


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


def _cols(buffer: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` columns of a (K, capacity) buffer, zero-padded if it is narrower."""
    part = buffer[:, :width]
    if part.shape[1] == width:
        return part
    return torch.nn.functional.pad(part, (0, width - part.shape[1]))


class GpuStreamingDecoder:
    """Decodes CTC log-probs chunk by chunk for many streams at once, on any torch device.

    The decoder holds only its config and tokenizer; all search state lives in `DecoderState`
    objects it creates, so one decoder serves every stream (the cache layer pools the states).
    A state created with ``batch`` rows is decoded by `decode_chunk`; many batch-1 states are
    decoded together by `decode_streams`, which stacks them, runs one batched search and hands
    each state its rows back as views.
    """

    def __init__(
        self,
        config: GpuDecoderConfig | None = None,
        tokenizer: Tokenizer | None = None,
        device: torch.device | str | None = None,
    ) -> None:
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

    @property
    def config(self) -> GpuDecoderConfig:
        return self._config

    def create_state(self, batch: int, vocab_size: int) -> DecoderState:
        """A fresh state of ``batch`` rows for a ``vocab_size``-token model."""
        self._check_vocab(vocab_size)
        cfg = self._config
        return new_state(
            batch, cfg.beam_size, cfg.initial_token_capacity, cfg.blank_id, self.device
        )

    def reset_state(self, state: DecoderState, batch: int, vocab_size: int) -> None:
        """Rewind ``state`` to a fresh one in place (buffers reused; rebuilt if batch differs)."""
        self._check_vocab(vocab_size)
        if state.batch_size != batch or state.beam_size != self._config.beam_size:
            fresh = self.create_state(batch, vocab_size)
            for name, value in vars(fresh).items():
                setattr(state, name, value)
            return
        reset_in_place(state, self._config.blank_id)

    def decode_chunk(
        self, log_probs: torch.Tensor, state: DecoderState, lengths: torch.Tensor | None = None
    ) -> None:
        """Advance every row of ``state`` by one chunk.

        Args:
            log_probs: (B, T, V) CTC log-probs, B = the state's rows.
            lengths: (B,) int valid frames per row (the rest is padding), None when all T are
                valid. A CPU tensor is best, even when decoding on CUDA: it is checked on the
                host and lets the search skip padding masks when every row is full.
        """
        chunk = prepare_chunk(log_probs, lengths, state, self._config)
        if log_probs.shape[1] == 0:
            return
        ensure_capacity(state, log_probs.shape[1])
        if self._config.is_greedy:
            greedy_chunk(chunk, state, self._config.blank_id)
        else:
            beam_chunk(chunk, state, self._config)
        update_frame_stats(chunk, state, self._config.blank_id)
        state.max_len_bound += log_probs.shape[1]

    def decode_streams(
        self,
        log_probs: torch.Tensor,
        states: list[DecoderState],
        lengths: torch.Tensor | None = None,
    ) -> None:
        """Advance B streams, one state each, with one batched search.

        Args:
            log_probs: (B, T, V); row i belongs to ``states[i]`` (each state holds one row).
            states: B states (each may hold several rows; rows are taken in order).
            lengths: (B,) valid frames per row, None when all T are valid (CPU tensor preferred).
        """
        if len(states) == 1:
            self.decode_chunk(log_probs, states[0], lengths)
            return
        stacked = stack_states(states)
        self.decode_chunk(log_probs, stacked, lengths)
        split_into(stacked, states)

    def step(
        self, log_probs: torch.Tensor, state: DecoderState, lengths: torch.Tensor | None = None
    ) -> Hypothesis:
        """`decode_chunk` then `partial` of row 0: one call per chunk for a live stream."""
        self.decode_chunk(log_probs, state, lengths)
        return self.partial(state)

    def partial(self, state: DecoderState, row: int = 0) -> Hypothesis:
        """The current best hypothesis of ``row`` (cheap: one small device-to-host copy)."""
        return self.partials([state], row)[0]

    def partials(self, states: list[DecoderState], row: int = 0) -> list[Hypothesis]:
        """Current best hypothesis of ``row`` of each state, with two transfers for all."""
        self._check_row(states, row)

        def rows(name: str) -> torch.Tensor:  # (N, K) row ``row`` of every state
            return torch.stack([getattr(s, name)[row] for s in states])

        total = torch.logaddexp(rows("log_pb"), rows("log_pnb"))  # (N, K)
        best = total.argmax(dim=1, keepdim=True)  # (N, 1)
        width = max(1, max(s.max_len_bound for s in states))
        pick = best[:, :, None].expand(-1, 1, width)  # (N, 1, width)
        tokens = torch.stack([_cols(s.tokens[row], width) for s in states]).gather(1, pick)
        frames = torch.stack([_cols(s.token_frames[row], width) for s in states]).gather(1, pick)
        packed = torch.cat(
            [rows("prefix_len").gather(1, best), tokens[:, 0].long(), frames[:, 0].long()], dim=1
        ).cpu()  # (N, 1 + 2 * width)
        scores = total.gather(1, best)[:, 0].cpu().tolist()
        hyps = []
        for score, line in zip(scores, packed.tolist(), strict=True):
            n = line[0]
            hyps.append(self._hypothesis(line[1 : 1 + n], score, line[1 + width : 1 + width + n]))
        return hyps

    def finalize_stream(self, state: DecoderState, row: int = 0) -> list[Hypothesis]:
        """The n-best hypotheses of ``row``, best first (``config.num_best`` at most).

        Never empty: if no hypothesis has a finite score (log-probs that were all -inf or NaN),
        the first one is returned with that score.
        """
        self._check_row([state], row)
        total = torch.logaddexp(state.log_pb[row], state.log_pnb[row]).cpu().tolist()
        lengths = state.prefix_len[row].cpu().tolist()
        tokens = state.tokens[row].cpu().tolist()
        frames = state.token_frames[row].cpu().tolist()
        order = sorted(range(len(total)), key=lambda k: -total[k])
        live = [k for k in order if total[k] > NEG_INF] or order[:1]
        return [
            self._hypothesis(tokens[k][: lengths[k]], total[k], frames[k][: lengths[k]])
            for k in live[: self._config.num_best]
        ]

    def frame_stats(self, states: list[DecoderState]) -> list[FrameStats]:
        """Endpointing inputs of every row of every state (one device-to-host transfer)."""
        packed = torch.stack(
            [
                torch.cat([s.num_frames for s in states]),
                torch.cat([s.num_trailing_blank_frames for s in states]),
                torch.cat([s.has_speech for s in states]).long(),
            ],
            dim=1,
        ).cpu()  # (rows, 3)
        return [FrameStats(n, t, bool(h)) for n, t, h in packed.tolist()]

    def _hypothesis(self, tokens: list[int], score: float, times: list[int]) -> Hypothesis:
        text = self.tokenizer.decode(tokens) if self.tokenizer is not None else ""
        return Hypothesis(tokens=tokens, text=text, score=float(score), timestamps=times)

    def _check_vocab(self, vocab_size: int) -> None:
        if not 0 <= self._config.blank_id < vocab_size:
            raise ValueError(
                f"blank_id {self._config.blank_id} is outside a vocabulary of {vocab_size}"
            )

    @staticmethod
    def _check_row(states: list[DecoderState], row: int) -> None:
        for s in states:
            if not 0 <= row < s.batch_size:
                raise IndexError(f"row {row} out of range for a state of {s.batch_size} rows")
