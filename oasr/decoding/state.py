"""Per-stream CTC decoder state: fixed beam width, plain tensors, cheap to stack and split.

The engine pools one `DecoderState` per stream (batch 1) and decodes B streams with one call,
so the layout is chosen for that: every field is a tensor whose first axis is the row, with
the same trailing shape in every state of one decoder (beam width K; token buffers padded to
a common capacity). Stacking B states is one ``torch.cat`` per field and splitting the result
back is ``torch.split`` (views, no copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

NEG_INF = float("-inf")
NO_TOKEN = -1
# Multiplier of the rolling prefix hash (odd, so the map h -> h * P is a bijection mod 2**64).
HASH_MULTIPLIER = 0x100000001B3


@dataclass
class DecoderState:
    """Search state of B rows (streams), K hypotheses (prefixes) per row.

    Invariants: live hypotheses of a row (finite ``log_pb`` or ``log_pnb``) hold distinct
    prefixes; ``tokens[b, k, :prefix_len[b, k]]`` is the prefix and ``token_frames`` the frame
    that first emitted each token; ``prefix_hash`` is the rolling hash of the prefix;
    ``max_len_bound >= prefix_len.max()`` (host-side, so growth checks need no device sync).
    Frame counters count encoder frames decoded since the last reset.

    Two live hypotheses are recognised as "prefix + one token" of each other by rolling hash
    rather than by comparing token buffers, which keeps the per-frame work O(K^2) per row; a
    false match needs a 64-bit hash collision between two prefixes.

    After a beam search the seven integer (B, K) fields are row views of one packed (B, 7, K)
    tensor (`oasr.decoding.search.pack_ints`): disjoint, so writing one never touches another,
    but not contiguous.

    Attributes:
        log_pb: (B, K) float32 log-prob of the prefix over alignments ending in blank.
        log_pnb: (B, K) float32 log-prob over alignments ending in its last token.
        prefix_len: (B, K) int64 tokens in the prefix.
        last_token: (B, K) int64 last token of the prefix, -1 for the empty prefix.
        prefix_hash: (B, K) int64 rolling hash (wrapping int64 arithmetic).
        tokens: (B, K, capacity) int32 token buffers.
        token_frames: (B, K, capacity) int32 first emitting frame of each token.
        prev_argmax: (B,) int64 argmax of the row's previous frame (blank at reset).
        num_frames: (B,) int64 frames decoded since reset.
        num_trailing_blank_frames: (B,) int64 frames since the last non-blank argmax frame.
        has_speech: (B,) bool whether any frame since reset had a non-blank argmax.
        lm_state: (B, K) int64 the LM automaton state after the prefix (0 = sentence start;
            stays 0 without an LM).
        lm_score: (B, K) float32 the prefix's fused LM score: lm_weight * its LM log-prob plus
            its insertion bonuses (0 without an LM). Ranking uses log_pb/log_pnb + lm_score.
        word_state: (B, K) int64 the word LM's lexicon-trie state after the prefix (0 = between
            words; stays 0 without a word LM). Its scores are part of ``lm_score``.
        prev_word: (B, K) int64 the code of the prefix's last closed word for a word bigram
            (0 = sentence start; see `oasr.lm.bigram`; stays 0 without one).
        ctx_state: (B, K) int64 the state of the row's hotword graph after the prefix
            (`oasr.decoding.context.ContextGraph`; 0 = a word start; stays 0 without one).
            Its gains are part of ``lm_score``.
        max_len_bound: host int, upper bound of ``prefix_len``.
        pool_row: the row of a `StateRows` storage this state's tensors are views of (a
            batch-1 state made by `GpuStreamingDecoder.create_state`); None for a state that
            owns its tensors.
        context: the hotword graph its rows are searched with (`GpuStreamingDecoder.
            set_context`); None: none.
    """

    log_pb: torch.Tensor
    log_pnb: torch.Tensor
    prefix_len: torch.Tensor
    last_token: torch.Tensor
    prefix_hash: torch.Tensor
    tokens: torch.Tensor
    token_frames: torch.Tensor
    prev_argmax: torch.Tensor
    num_frames: torch.Tensor
    num_trailing_blank_frames: torch.Tensor
    has_speech: torch.Tensor
    lm_state: torch.Tensor
    lm_score: torch.Tensor
    word_state: torch.Tensor
    prev_word: torch.Tensor
    ctx_state: torch.Tensor
    max_len_bound: int = 0
    pool_row: int | None = field(default=None, compare=False)
    context: Any = field(default=None, compare=False)

    @property
    def batch_size(self) -> int:
        return self.log_pb.shape[0]

    @property
    def beam_size(self) -> int:
        return self.log_pb.shape[1]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[2]

    @property
    def device(self) -> torch.device:
        return self.log_pb.device


HOST_FIELDS = ("max_len_bound", "pool_row", "context")
TENSOR_FIELDS = tuple(f.name for f in fields(DecoderState) if f.name not in HOST_FIELDS)


def new_state(
    batch: int, beam_size: int, capacity: int, blank_id: int, device: torch.device
) -> DecoderState:
    """A state of ``batch`` rows at reset (only hypothesis 0, the empty prefix, is live)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")

    def full(shape: tuple[int, ...], value: float | int | bool, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(shape, value, dtype=dtype, device=device)

    bk = (batch, beam_size)
    state = DecoderState(
        log_pb=full(bk, NEG_INF, torch.float32),
        log_pnb=full(bk, NEG_INF, torch.float32),
        prefix_len=full(bk, 0, torch.int64),
        last_token=full(bk, NO_TOKEN, torch.int64),
        prefix_hash=full(bk, 0, torch.int64),
        tokens=full((*bk, capacity), 0, torch.int32),
        token_frames=full((*bk, capacity), 0, torch.int32),
        prev_argmax=full((batch,), blank_id, torch.int64),
        num_frames=full((batch,), 0, torch.int64),
        num_trailing_blank_frames=full((batch,), 0, torch.int64),
        has_speech=full((batch,), False, torch.bool),
        lm_state=full(bk, 0, torch.int64),
        lm_score=full(bk, 0.0, torch.float32),
        word_state=full(bk, 0, torch.int64),
        prev_word=full(bk, 0, torch.int64),
        ctx_state=full(bk, 0, torch.int64),
    )
    state.log_pb[:, 0].fill_(0.0)
    return state


def reset_in_place(state: DecoderState, blank_id: int) -> None:
    """Rewind every row of ``state`` to reset, reusing its buffers (token buffers are left as
    they are: nothing past ``prefix_len`` is ever read)."""
    state.log_pb.fill_(NEG_INF)
    state.log_pb[:, 0].fill_(0.0)
    state.log_pnb.fill_(NEG_INF)
    state.prefix_len.zero_()
    state.last_token.fill_(NO_TOKEN)
    state.prefix_hash.zero_()
    state.prev_argmax.fill_(blank_id)
    state.num_frames.zero_()
    state.num_trailing_blank_frames.zero_()
    state.has_speech.fill_(False)
    state.lm_state.zero_()
    state.lm_score.zero_()
    state.word_state.zero_()
    state.prev_word.zero_()
    state.ctx_state.zero_()
    state.max_len_bound = 0


def hash_append(prefix_hash: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rolling hash of a prefix extended by ``token`` (same shapes, int64, wrapping)."""
    return prefix_hash * HASH_MULTIPLIER + (token + 1)


def ensure_capacity(state: DecoderState, num_new_frames: int) -> None:
    """Grow the token buffers so ``num_new_frames`` more frames (at most one token each) plus
    one scratch slot fit. Syncs with the device only when the host bound says it may not fit."""
    needed = state.max_len_bound + num_new_frames + 1
    if needed <= state.capacity:
        return
    state.max_len_bound = int(state.prefix_len.max().item())
    needed = state.max_len_bound + num_new_frames + 1
    if needed <= state.capacity:
        return
    new_capacity = max(needed, 2 * state.capacity)
    state.tokens = pad_capacity(state.tokens, new_capacity)
    state.token_frames = pad_capacity(state.token_frames, new_capacity)


def pad_capacity(buffer: torch.Tensor, capacity: int) -> torch.Tensor:
    """(B, K, c) -> (B, K, capacity) zero-padded; the tensor itself when already that wide."""
    if buffer.shape[2] == capacity:
        return buffer
    return torch.nn.functional.pad(buffer, (0, capacity - buffer.shape[2]))


def stack_states(states: list[DecoderState]) -> DecoderState:
    """Concatenate the rows of several states of the same beam width (token buffers padded to
    the largest capacity). The result shares no memory with the inputs."""
    if not states:
        raise ValueError("stack_states needs at least one state")
    beams = {s.beam_size for s in states}
    if len(beams) != 1:
        raise ValueError(f"states have different beam widths {sorted(beams)}")
    capacity = max(s.capacity for s in states)
    parts: dict[str, Any] = {}
    for name in TENSOR_FIELDS:
        tensors = [getattr(s, name) for s in states]
        if name in ("tokens", "token_frames"):
            tensors = [pad_capacity(t, capacity) for t in tensors]
        parts[name] = torch.cat(tensors, dim=0)
    return DecoderState(**parts, max_len_bound=max(s.max_len_bound for s in states))


def split_into(stacked: DecoderState, states: list[DecoderState]) -> None:
    """Hand the rows of ``stacked`` back to ``states`` (in order, each keeping its batch size).

    The states' fields become views of ``stacked``'s tensors: no copy, no kernel launch.
    """
    sizes = [s.batch_size for s in states]
    if sum(sizes) != stacked.batch_size:
        raise ValueError(f"states hold {sum(sizes)} rows, stacked state has {stacked.batch_size}")
    for name in TENSOR_FIELDS:
        for state, part in zip(states, torch.split(getattr(stacked, name), sizes), strict=True):
            setattr(state, name, part)
    for state in states:
        state.max_len_bound = stacked.max_len_bound
