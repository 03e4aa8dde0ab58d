"""Batched CTC search kernels: greedy and prefix beam search over a `DecoderState`.

The prefix beam search here is the reference and what CUDA runs; on a CPU the decoder runs the
same search compiled (`oasr.decoding.compiled_search`), whose cost is not the operation count
described below.

Everything here is vectorised over rows (streams), hypotheses and candidate tokens; the only
Python loop is over the frames of a chunk, because each frame's beam depends on the last.

On a CPU the beam search's cost is the number of small tensor operations per frame, not their
arithmetic, so a frame is kept to a fixed, small set of them: whatever does not depend on the
previous frame (candidate tokens and log-probs, each token's candidate column) is computed
once per chunk (`candidate_tables`); index tables of the score layout once per chunk
(`ScoreLayout`); score tensors are written in place into per-chunk buffers (`FrameBuffers`;
these three live in `oasr.decoding.beam_tables`); corrections that touch one entry per
hypothesis are (B, K) scatters into per-hypothesis blocks with a scratch column instead of
(B, K, C) masks; the seven integer fields travel packed (`pack_ints`), so one gather and one
select carry them all forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.decoding.beam_tables import (
    CandidateFrame,
    ChunkFrames,
    FrameBuffers,
    ScoreLayout,
    candidate_tables,
)
from oasr.decoding.config import DecoderConfig
from oasr.decoding.context import ContextBatch
from oasr.decoding.lm_fusion import LmFusion
from oasr.decoding.state import (
    HASH_MULTIPLIER,
    NEG_INF,
    NO_TOKEN,
    DecoderState,
    hash_append,
)


def prepare_chunk(
    log_probs: torch.Tensor,
    lengths: torch.Tensor | None,
    state: DecoderState,
    config: DecoderConfig,
) -> ChunkFrames:
    """Validate and prepare ``log_probs`` (B, T, V) with optional ``lengths`` (B,)."""
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (B, T, V), got shape {tuple(log_probs.shape)}")
    batch, num_frames, vocab = log_probs.shape
    if batch != state.batch_size:
        raise ValueError(f"log_probs has {batch} rows but the state holds {state.batch_size}")
    if not 0 <= config.blank_id < vocab:
        raise ValueError(f"blank_id {config.blank_id} is outside a vocabulary of {vocab}")
    lp = log_probs.to(device=state.device, dtype=torch.float32)
    if config.blank_penalty:
        lp = lp.clone()
        lp[:, :, config.blank_id] -= config.blank_penalty
    steps = torch.arange(num_frames, device=state.device)
    all_valid = lengths is None
    if lengths is not None:
        if tuple(lengths.shape) != (batch,):
            raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        if lengths.device.type == "cpu":  # host lengths: check them without a device sync
            if bool(((lengths < 0) | (lengths > num_frames)).any()):
                raise ValueError(f"lengths must be in 0..{num_frames}, got {lengths.tolist()}")
            all_valid = bool((lengths == num_frames).all())
    if all_valid:  # known on the host: no copy of the lengths to the device
        valid = torch.ones((batch, num_frames), dtype=torch.bool, device=state.device)
    else:
        assert lengths is not None
        valid = steps[None, :] < lengths.to(state.device, non_blocking=True)[:, None]  # (B, T)
    top_lp = top_tok = None
    if config.is_greedy:
        max_lp, argmax = lp.max(dim=-1)  # (B, T)
    else:  # one pass over the vocabulary gives both the argmax and the search candidates
        num_top = min(config.num_candidates(vocab) + 1, vocab)
        top_lp, top_tok = lp.topk(num_top, dim=-1)  # (B, T, C + 1)
        max_lp, argmax = top_lp[..., 0], top_tok[..., 0]
    return ChunkFrames(
        log_probs=lp,
        valid=valid,
        num_valid=valid.sum(dim=1),
        frame_index=state.num_frames[:, None] + steps[None, :],
        argmax=argmax,
        max_log_prob=max_lp,
        all_valid=all_valid,
        top_log_probs=top_lp,
        top_tokens=top_tok,
    )


def update_frame_stats(chunk: ChunkFrames, state: DecoderState, blank_id: int) -> None:
    """Advance the endpointing counters: frames, trailing blank frames, speech seen."""
    non_blank = chunk.valid & (chunk.argmax != blank_id)  # (B, T)
    steps = torch.arange(non_blank.shape[1], device=non_blank.device)
    last_non_blank = torch.where(non_blank, steps, -1).max(dim=1).values  # (B,)
    state.num_trailing_blank_frames = torch.where(
        last_non_blank >= 0,
        chunk.num_valid - 1 - last_non_blank,
        state.num_trailing_blank_frames + chunk.num_valid,
    )
    state.has_speech = state.has_speech | non_blank.any(dim=1)
    last_valid = (chunk.num_valid - 1).clamp(min=0)[:, None]
    state.prev_argmax = torch.where(
        chunk.num_valid > 0, chunk.argmax.gather(1, last_valid)[:, 0], state.prev_argmax
    )
    state.num_frames = state.num_frames + chunk.num_valid


def greedy_chunk(chunk: ChunkFrames, state: DecoderState, blank_id: int) -> None:
    """Argmax, collapse repeats, drop blanks; hypothesis 0 of each row holds the result.

    Must run before `update_frame_stats` (it reads the previous chunk's last argmax).
    """
    best = chunk.argmax  # (B, T)
    prev = torch.cat([state.prev_argmax[:, None], best[:, :-1]], dim=1)  # (B, T)
    emit = chunk.valid & (best != blank_id) & (best != prev)  # (B, T)
    start = state.prefix_len[:, 0]  # (B,)
    pos = start[:, None] + emit.cumsum(dim=1) - 1  # (B, T)
    scratch = state.capacity - 1
    index = torch.where(emit, pos, scratch)
    state.tokens[:, 0].scatter_(1, index, best.to(torch.int32))
    state.token_frames[:, 0].scatter_(1, index, chunk.frame_index.to(torch.int32))
    new_len = start + emit.sum(dim=1)  # (B,)
    last = state.tokens[:, 0].gather(1, (new_len - 1).clamp(min=0)[:, None])[:, 0].long()
    state.prefix_len = new_len[:, None]
    state.last_token = torch.where(new_len > 0, last, NO_TOKEN)[:, None]
    path_lp = torch.where(chunk.valid, chunk.max_log_prob, 0.0).sum(dim=1)  # (B,)
    state.log_pb = state.log_pb + path_lp[:, None]


@dataclass(frozen=True)
class FrameChoice:
    """Which candidate each new hypothesis came from at one frame (for the backtrace).

    Attributes:
        parent: (B, K) int64 hypothesis of the previous frame it continues.
        is_extension: (B, K) bool whether it appended ``token`` to the parent's prefix.
        token: (B, K) int64 the appended token (meaningless when not an extension).
    """

    parent: torch.Tensor
    is_extension: torch.Tensor
    token: torch.Tensor


@dataclass(frozen=True)
class _Children:
    """Hypothesis pairs of one frame where child = parent + the child's last token.

    Each child has at most one parent among the live hypotheses (their prefixes are distinct).

    Attributes:
        has_parent: (B, Kc) bool whether the child's parent is a live hypothesis.
        parent: (B, Kc) int64 that parent (0 when there is none).
        merged: (B, Kc) float32 log-prob the parent sends into the child's prefix this frame.
    """

    has_parent: torch.Tensor
    parent: torch.Tensor
    merged: torch.Tensor


# Pairing keys (wrapping int64): a parent's key is its prefix hash times the hash multiplier,
# a child's is its hash minus its last token's term, so child = parent + last token <=> equal
# keys, up to a 64-bit hash collision as for the prefix hash itself (below 2**64 the hash is the
# prefix's base-P digits, injective across lengths). Hypotheses that cannot pair get sentinels.
NO_PARENT_KEY = 0x5851F42D4C957F2D
_NO_CHILD_KEY = 0x14057B7EF767814F


def _find_children(state: DecoderState, total: torch.Tensor, lp_last: torch.Tensor,
                   last1: torch.Tensor) -> _Children:
    """Pair live hypotheses as parent / child (see `_Children`); ``total``, ``lp_last`` and
    ``last1`` are (B, K): each hypothesis's log-prob, its last token's log-prob at this frame
    and its last token + 1 (0 for the empty prefix).

    One (B, K, K) comparison of pairing keys instead of comparing lengths, hashes and
    liveness pair by pair: the per-frame cost is dominated by the number of such tensors.
    """
    alive = total > NEG_INF  # (B, K)
    last, h = state.last_token, state.prefix_hash
    parent_key = torch.where(alive, h * HASH_MULTIPLIER, NO_PARENT_KEY)
    child_key = torch.where(alive & (last1 > 0), h - last1, _NO_CHILD_KEY)  # (B, K)
    child_of = child_key.unsqueeze(2) == parent_key.unsqueeze(1)  # (B, Kc, Kp)
    found, parent = child_of.view(torch.uint8).max(dim=2)  # (B, Kc): at most one match each
    has_parent = found.view(torch.bool)
    # A repeated token needs a blank in between: only the parent's blank-ending paths count.
    via = torch.where(
        last.gather(1, parent) == last, state.log_pb.gather(1, parent), total.gather(1, parent)
    )
    merged = torch.where(has_parent, via + lp_last, NEG_INF)
    return _Children(has_parent=has_parent, parent=parent, merged=merged)


def _extension_scores(state: DecoderState, frame: CandidateFrame, layout: ScoreLayout,
                      buffers: FrameBuffers, total: torch.Tensor, last_slot: torch.Tensor,
                      children: _Children) -> torch.Tensor:
    """(B, K * (C + 1)) acoustic log-prob of each hypothesis extended by each candidate
    (`ScoreLayout` blocks, in ``buffers.ext``; the scratch columns hold garbage)."""
    width = frame.log_probs.shape[1]  # C + 1
    ext = buffers.ext
    torch.add(total.unsqueeze(2), frame.log_probs.unsqueeze(1), out=buffers.ext_blocks)
    # A repeated token extends only the blank-ending paths.
    repeat = state.log_pb + frame.log_probs.gather(1, last_slot)  # (B, K)
    ext.scatter_(1, layout.blocks + last_slot, repeat)
    # An extension that equals a live hypothesis was already merged into it: parent p's
    # candidate c is a duplicate when some child of p has last token c.
    dup = torch.where(children.has_parent, children.parent * width + last_slot,
                      layout.scratch)  # (B, K)
    return ext.scatter_(1, dup, NEG_INF)


# The integer (B, K) fields, searched packed as one (B, 7, K) tensor whose rows the state's
# fields are views of: one gather and one select per frame carry all of them forward.
INT_FIELDS = ("prefix_len", "last_token", "prefix_hash", "lm_state", "word_state", "prev_word",
              "ctx_state")


def pack_ints(state: DecoderState) -> torch.Tensor:
    """(B, 7, K) the state's `INT_FIELDS` stacked; the state's fields become its row views."""
    ints = torch.stack([getattr(state, name) for name in INT_FIELDS], dim=1)
    point_ints(state, ints)
    return ints


def point_ints(state: DecoderState, ints: torch.Tensor) -> None:
    for name, row in zip(INT_FIELDS, ints.unbind(1), strict=True):
        setattr(state, name, row)


def beam_frame(
    state: DecoderState,
    ints: torch.Tensor,
    frame: CandidateFrame,
    layout: ScoreLayout,
    buffers: FrameBuffers,
    fusion: LmFusion | None = None,
    context: ContextBatch | None = None,
) -> tuple[FrameChoice, torch.Tensor]:
    """One frame of CTC prefix beam search on every row; updates the (B, K) score fields.

    Args:
        ints: (B, 7, K) the state's `INT_FIELDS`, packed (`pack_ints`).
        frame: the frame's log-probs and candidate tokens (see `candidate_tables`).
        layout, buffers: `ScoreLayout` and `FrameBuffers` of the state's beam width and the
            frame's candidates.
        fusion: an LM to rank by acoustic + fused LM score (the stored scores stay acoustic).
        context: the rows' hotword graphs: their gains join the fused score (``lm_score``).
    Returns:
        the frame's choice and the new packed ints (the state's fields are its views).
    """
    k = state.beam_size
    num_cand = frame.tokens.shape[1]
    pb, pnb, last = state.log_pb, state.log_pnb, state.last_token
    last1 = last + 1  # (B, K) column of the last token in the frame's tables
    total = torch.logaddexp(pb, pnb)  # (B, K)
    lp_last = frame.lp.gather(1, last1)  # (B, K)
    stay_pb = total + frame.lp_blank.unsqueeze(1)
    stay_pnb = pnb + lp_last  # the empty prefix's log_pnb is -inf: it stays -inf
    children = _find_children(state, total, lp_last, last1)
    stay_pnb = torch.logaddexp(stay_pnb, children.merged)
    last_slot = frame.slot.gather(1, last1)  # (B, K)
    ext = _extension_scores(state, frame, layout, buffers, total, last_slot, children)
    ext_blocks = buffers.ext_blocks[:, :, :num_cand]  # (B, K, C)
    lm_ext = buffers.lm_ext
    fused = (fusion is not None or context is not None) and lm_ext is not None
    ctx_next = None
    if fused:  # ranking only: stored scores stay acoustic
        assert lm_ext is not None
        if fusion is not None:
            fusion.extension_scores(state, frame.tokens, out=lm_ext)
        else:
            lm_ext.copy_(state.lm_score.unsqueeze(2).expand_as(lm_ext))
        if context is not None:
            ctx_gain, ctx_next = context.step(state.ctx_state, frame.tokens)
            lm_ext.add_(ctx_gain)
        torch.add(torch.logaddexp(stay_pb, stay_pnb), state.lm_score, out=buffers.stay)
        torch.add(ext_blocks, lm_ext, out=buffers.moves)
    else:
        torch.logaddexp(stay_pb, stay_pnb, out=buffers.stay)
        buffers.moves.copy_(ext_blocks)
    index = buffers.scores.topk(k, dim=1).indices  # (B, K)
    is_ext = index >= k
    parent = torch.take(layout.parent, index)
    token = frame.tokens.gather(1, torch.take(layout.column, index))
    slot = torch.take(layout.slot, index)  # the chosen extension's position in ``ext``
    moved = None
    if fused:
        assert lm_ext is not None
        moved = torch.take(layout.moved, index)
        state.lm_score = torch.where(is_ext, lm_ext.view(lm_ext.shape[0], -1).gather(1, moved),
                                     state.lm_score.gather(1, parent))
    state.log_pb = torch.where(is_ext, NEG_INF, stay_pb.gather(1, parent))
    state.log_pnb = torch.where(is_ext, ext.gather(1, slot), stay_pnb.gather(1, parent))
    inherited = ints.gather(2, parent.unsqueeze(1).expand(-1, ints.shape[1], -1))  # (B, 7, K)
    p_len, _, p_hash, p_lm, p_word, p_prev, p_ctx = inherited.unbind(1)
    extended = [p_len + 1, token, hash_append(p_hash, token)]
    extended += fusion.extended_states(p_lm, p_word, p_prev, token) if fusion is not None \
        else [p_lm, p_word, p_prev]
    if ctx_next is not None and moved is not None:
        extended.append(ctx_next.view(ctx_next.shape[0], -1).gather(1, moved))
    else:
        extended.append(p_ctx)
    ints = torch.where(is_ext.unsqueeze(1), torch.stack(extended, dim=1), inherited)
    point_ints(state, ints)
    return FrameChoice(parent=parent, is_extension=is_ext, token=token), ints


def _keep_padded_rows(state: DecoderState, before: dict[str, torch.Tensor], ints: torch.Tensor,
                      choice: FrameChoice, valid: torch.Tensor) -> tuple[FrameChoice, torch.Tensor]:
    """Undo a frame's update on rows whose frame is padding (``valid`` (B,) False): the float
    fields from ``before``, the packed ints from ``before["ints"]``."""
    keep = valid[:, None]  # (B, 1)
    for name, old in before.items():
        if name != "ints":
            setattr(state, name, torch.where(keep, getattr(state, name), old))
    ints = torch.where(keep[:, :, None], ints, before["ints"])
    point_ints(state, ints)
    identity = torch.arange(state.beam_size, device=valid.device).expand_as(choice.parent)
    choice = FrameChoice(
        parent=torch.where(keep, choice.parent, identity),
        is_extension=choice.is_extension & keep,
        token=choice.token,
    )
    return choice, ints


def _apply_backtrace(
    state: DecoderState,
    choices: list[FrameChoice],
    start_len: torch.Tensor,
    frame_index: torch.Tensor,
) -> None:
    """Rebuild the token buffers once per chunk from the frames' parent pointers.

    Args:
        start_len: (B, K) prefix lengths before the chunk.
        frame_index: (B, T) frame numbers of the chunk.
    """
    batch, k = start_len.shape
    ancestor = torch.arange(k, device=start_len.device).expand(batch, k)  # (B, K)
    ext_path, tok_path = [], []
    for choice in reversed(choices):
        ext_path.append(choice.is_extension.gather(1, ancestor))
        tok_path.append(choice.token.gather(1, ancestor))
        ancestor = choice.parent.gather(1, ancestor)
    extends = torch.stack(ext_path[::-1], dim=2)  # (B, K, T)
    tokens_added = torch.stack(tok_path[::-1], dim=2)  # (B, K, T)
    rows = ancestor[:, :, None].expand(-1, -1, state.capacity)  # (B, K, cap)
    tokens = state.tokens.gather(1, rows)
    frames = state.token_frames.gather(1, rows)
    pos = start_len.gather(1, ancestor)[:, :, None] + extends.cumsum(dim=2) - 1  # (B, K, T)
    index = torch.where(extends, pos, state.capacity - 1)
    tokens.scatter_(2, index, tokens_added.to(torch.int32))
    frames.scatter_(2, index, frame_index[:, None, :].expand(-1, k, -1).to(torch.int32))
    state.tokens, state.token_frames = tokens, frames


_FLOAT_FIELDS = ("log_pb", "log_pnb", "lm_score")


def beam_chunk(chunk: ChunkFrames, state: DecoderState, config: DecoderConfig,
               fusion: LmFusion | None = None, context: ContextBatch | None = None) -> None:
    """CTC prefix beam search over one chunk for every row of ``state`` (``fusion``: an LM
    to fuse into the ranking; ``context``: the rows' hotword graphs; see `beam_frame`)."""
    frames = candidate_tables(chunk, config)
    if not frames:
        return
    num_cand = frames[0].tokens.shape[1]
    layout = ScoreLayout.build(state.beam_size, num_cand, state.device)
    buffers = FrameBuffers.build(state.batch_size, state.beam_size, num_cand,
                                 fusion is not None or context is not None, state.device)
    start_len = state.prefix_len
    ints = pack_ints(state)
    choices = []
    for t, frame in enumerate(frames):
        before = {} if chunk.all_valid else {n: getattr(state, n) for n in _FLOAT_FIELDS}
        before_ints = ints
        choice, ints = beam_frame(state, ints, frame, layout, buffers, fusion, context)
        if before:
            choice, ints = _keep_padded_rows(state, {**before, "ints": before_ints}, ints,
                                             choice, chunk.valid[:, t])
        choices.append(choice)
    _apply_backtrace(state, choices, start_len, chunk.frame_index)
