"""Whisper-CTC's batched paged chunk forward: B streams, each at its own offset, in one call.

Per row: a chunk of log-mel frames and the stream's conv-stem left context (declared state,
seed spec §10.1) -> encoder frames at absolute positions ``offset ..``; every layer writes the
chunk's K/V into the shared paged pool and attends over the stream's cached frames plus the
whole chunk (the chunk-causal mask ``WhisperCtcModel.forward`` trains with). The result equals
``WhisperCtcModel.forward(mel, lens, chunk_frames, left_chunks=-1)`` on the whole stream when
the pool keeps every frame, and ``left_chunks=k`` when it keeps the last k chunks.

State per stream (zeros at the start and after a reset, the padding the full forward applies):
``conv1``: the last 2 log-mel frames (conv1's left context), (2, n_mels);
``conv2``: the last 2 GELU(conv1) frames (conv2's left context), (2, width).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from oasr.cache.slot_state import StateView
from oasr.fmha import PagedKVCache, paged_attention, write_chunk_kv
from oasr.models.fused_linear import (
    conv_weight_as_linear,
    fusable,
    linear,
    linear_weights,
    packed_weight,
)
from oasr.models.whisper_ctc.config import WhisperCtcConfig
from oasr.models.whisper_ctc.model import (
    CONV1_STATE,
    CONV2_STATE,
    CONV_CONTEXT,
    whisper_ctc_state_specs,
)

if TYPE_CHECKING:
    from oasr.models.whisper_ctc.model import WhisperCtcBlock, WhisperCtcModel

SUBSAMPLING = WhisperCtcConfig.subsampling  # log-mel frames per encoder frame
# the most bytes of the FFN's hidden layer made at once (see `_feed_forward`): 16,384 rows of
# 1,536 units in bfloat16 (512 streams of 32 frames), 8,192 in float32
FFN_PIECE_BYTES = 48 << 20
__all__ = ["CONV1_STATE", "CONV2_STATE", "WhisperChunkOutput", "conv_stem",
           "forward_chunk_paged", "forward_chunk_states", "prepack", "whisper_ctc_state_specs"]


@dataclass(frozen=True)
class WhisperChunkOutput:
    """What one batched chunk forward returns.

    Attributes:
        log_probs: (B, T // 2, V) float32 CTC log-probabilities; rows past ``lengths`` are padding.
        lengths: (B,) int64 valid encoder frames per row (``mel_lens // 2``).
        conv1_state: (B, 2, n_mels) the rows' new conv1 left context.
        conv2_state: (B, 2, width) the rows' new conv2 left context.
    """

    log_probs: Tensor
    lengths: Tensor
    conv1_state: Tensor
    conv2_state: Tensor


def forward_chunk_paged(
    model: WhisperCtcModel,
    mel: Tensor,
    mel_lens: Tensor,
    offsets: Tensor,
    caches: list[PagedKVCache],
    conv1_state: Tensor,
    conv2_state: Tensor,
    max_offset: int | None = None,
) -> WhisperChunkOutput:
    """One chunk of B streams through the conv stem, the paged encoder blocks and the CTC head.

    The caller allocated each row's blocks (``prepare_chunks_batched``) and commits
    ``lengths`` frames after; ``caches[l].cache_seqlens`` are the frames each row holds.

    Args:
        model: the Whisper-CTC model (eval mode).
        mel: (B, T, n_mels) log-mel frames, rows zero-padded past ``mel_lens``; T is even
            except for a stream's last chunk.
        mel_lens: (B,) int64 valid frames per row.
        offsets: (B,) int64 encoder frames each stream produced since its start or last reset.
        caches: one PagedKVCache per block.
        conv1_state: (B, 2, n_mels); conv2_state: (B, 2, width).
        max_offset: host-side ``offsets.max()`` (avoids a device sync).
    Returns:
        `WhisperChunkOutput`.
    Raises:
        ValueError: a position past ``max_positions`` (the engine resets a stream before it),
            or a cache count that is not one per block.
    """
    if len(caches) != len(model.blocks):
        raise ValueError(f"got {len(caches)} PagedKVCaches for {len(model.blocks)} blocks")
    x, new_conv1, new_conv2 = conv_stem(model, mel, mel_lens, conv1_state, conv2_state)
    lengths = mel_lens.to(x.device).long() // SUBSAMPLING  # (B,)
    x = x.add_(_positions(model, offsets, x.size(1), max_offset).to(x.dtype))  # (B, T', W)
    for block, cache in zip(model.blocks, caches, strict=True):
        x = _block_paged(block, x, lengths, cache)  # type: ignore[arg-type]
    return WhisperChunkOutput(model.ctc_log_probs(x), lengths, new_conv1, new_conv2)


def forward_chunk_states(
    model: WhisperCtcModel,
    mel: Tensor,
    mel_lens: Tensor,
    offsets: Tensor,
    caches: list[PagedKVCache],
    states: Mapping[str, StateView],
    max_offset: int | None = None,
) -> WhisperChunkOutput:
    """`forward_chunk_paged` with the declared state (``model.streaming_state_specs``) read
    and written by name: the conv-stem tails are gathered from
    ``states["conv1"]`` / ``states["conv2"]`` and the new ones scattered back.

    Args:
        states: one gather/scatter view per declared state (the engine's).
    Returns:
        `WhisperChunkOutput`.
    """
    conv1, conv2 = states[CONV1_STATE], states[CONV2_STATE]
    out = forward_chunk_paged(model, mel, mel_lens, offsets, caches, conv1.gather(),
                              conv2.gather(), max_offset)
    conv1.scatter(out.conv1_state)  # (B, 2, n_mels)
    conv2.scatter(out.conv2_state)  # (B, 2, width)
    return out


def prepack(model: WhisperCtcModel) -> int:
    """Reorder every weight the fused chunk step multiplies by (`oasr.models.fused_linear`)
    now, so the first chunk served does not: the blocks' QKV, out, FFN up and down, and both
    stem convs. Call after the model has its serving dtype and device; a no-op where the
    step does not fuse (float32, CUDA). Returns the weights packed."""
    layers: list[torch.nn.Module] = []
    for block in model.blocks:
        layers += [block.qkv, block.out, block.ffn.up, block.ffn.down]  # type: ignore[union-attr,list-item]
    count = 0
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, torch.nn.Linear) and fusable(layer.weight):
                packed_weight(layer.weight)
                count += 1
        for conv in (model.conv1, model.conv2):
            if fusable(conv.weight):
                packed_weight(conv_weight_as_linear(conv))
                count += 1
    return count


def conv_stem(
    model: WhisperCtcModel, mel: Tensor, mel_lens: Tensor, conv1_state: Tensor, conv2_state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The causal conv stem over a chunk, its left context taken from (and returned to) state.

    Frames stay channel-last (B, T, C) throughout. On CPU each conv is one matmul over its
    windows (`_causal_conv`): no (B, C, T) transposes, and in bfloat16 the bias and GELU run
    inside the matmul (`oasr.models.fused_linear`).

    Args:
        mel: (B, T, n_mels); mel_lens: (B,) valid frames; conv1_state: (B, 2, n_mels);
            conv2_state: (B, 2, width); all in the model's dtype (a state in another dtype is
            cast, a copy the engine avoids by keeping state in the compute dtype).
    Returns:
        x (B, T // 2, width) encoder input before positions, new conv1_state (B, 2, n_mels),
        new conv2_state (B, 2, width): each the last 2 of the row's valid frames.
    """
    frames = mel.size(1)
    ext1 = torch.cat([conv1_state.to(mel.dtype), mel], dim=1)  # (B, 2 + T, M)
    hidden = _causal_conv(model.conv1, ext1, frames, stride=1)  # (B, T, W)
    ext2 = torch.cat([conv2_state.to(hidden.dtype), hidden], dim=1)  # (B, 2 + T, W)
    # frames are consumed in pairs: an odd trailing frame makes no encoder frame
    x = _causal_conv(model.conv2, ext2, frames // SUBSAMPLING, stride=SUBSAMPLING)  # (B, T // 2, W)
    tail = mel_lens.to(mel.device).long().unsqueeze(1) + torch.arange(
        CONV_CONTEXT, device=mel.device)  # (B, 2): ext index of the last 2 valid frames
    return x, _take_rows(ext1, tail), _take_rows(ext2, tail)


def _causal_conv(conv: torch.nn.Conv1d, ext: Tensor, outputs: int, stride: int) -> Tensor:
    """GELU(conv(ext)) for a kernel-3 conv with no padding, channel-last.

    On CPU: out[b, t] = GELU(W [ext[b, s t], ext[b, s t + 1], ext[b, s t + 2]] + bias), one
    matmul of the (B * outputs, 3 C_in) windows by the kernel laid out as a (C_out, 3 C_in)
    Linear weight (`fused_linear.conv_weight_as_linear`). Elsewhere: ``conv1d`` on the
    transposed frames.

    Args:
        ext: (B, CONV_CONTEXT + T, C_in) frames with their left context.
        outputs: output frames (the first ``outputs`` windows at ``stride``).
    Returns:
        (B, outputs, C_out).
    """
    batch, _, channels = ext.shape
    span = (outputs - 1) * stride + 3
    if outputs == 0:
        return ext.new_zeros(batch, 0, conv.out_channels)
    if ext.device.type != "cpu":
        return F.gelu(conv(ext[:, :span].transpose(1, 2))).transpose(1, 2)
    windows = ext[:, :span].unfold(1, 3, stride).transpose(2, 3)  # (B, outputs, 3, C_in) view
    rows = windows.reshape(batch * outputs, 3 * channels)  # (B * outputs, 3 C_in)
    out = linear_weights(rows, conv_weight_as_linear(conv), conv.bias, gelu=True)
    return out.view(batch, outputs, -1)  # (B, outputs, C_out)


def _take_rows(x: Tensor, index: Tensor) -> Tensor:
    """x: (B, T, C), index: (B, K) -> (B, K, C) with out[b, k] = x[b, index[b, k]]."""
    return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(2)))


def _positions(model: WhisperCtcModel, offsets: Tensor, num_frames: int,
               max_offset: int | None) -> Tensor:
    """(B, T', width) positional rows ``offsets[b] + t`` of the model's table."""
    table = model.positions  # (max_positions, W)
    limit = table.size(0)
    top = int(offsets.max()) if max_offset is None else int(max_offset)
    if top + num_frames > limit:
        raise ValueError(
            f"encoder positions up to {top + num_frames - 1} requested but the model has "
            f"{limit} (max_positions): the stream must be reset before {limit} frames"
        )
    index = offsets.to(table.device).long().unsqueeze(1) + torch.arange(
        num_frames, device=table.device)  # (B, T')
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.size(1))


def _block_paged(block: WhisperCtcBlock, x: Tensor, lengths: Tensor, cache: PagedKVCache) -> Tensor:
    """One pre-norm encoder block with its self-attention K/V in the paged pool.

    The projections go through `oasr.models.fused_linear.linear` (in bfloat16 on CPU: the
    bias, the FFN's GELU and both residual adds inside the matmuls); the queries and the
    chunk's K/V are views of the fused QKV output, and the attention's output is read by the
    out projection without a copy.

    Args:
        x: (B, T', W); lengths: (B,) valid frames per row (the keys this chunk adds).
    Returns:
        (B, T', W).
    """
    batch, frames, width = x.shape
    heads = block.heads
    qkv = linear(block.attn_norm(x), block.qkv)  # (B, T', 3W)
    q, k, v = qkv.view(batch, frames, 3, heads, width // heads).unbind(2)  # each (B, T', H, D)
    write_chunk_kv(cache, k, v)
    att = paged_attention(q, cache, q_lens=lengths)  # (B, T', H, D)
    x = linear(att.reshape(batch, frames, width), block.out, residual=x)  # (B, T', W)
    return _feed_forward(block, x)


def _feed_forward(block: WhisperCtcBlock, x: Tensor) -> Tensor:
    """The block's pre-norm FFN with its residual, in pieces of rows when its hidden layer
    would be over ``FFN_PIECE_BYTES``.

    A whole large batch's hidden layer is one buffer of B x T' x 4W (71 MiB at 720 streams
    in bfloat16): past the 64 MiB heaps glibc gives a thread, it would be a fresh ``mmap``
    whose pages are faulted in every step (`oasr.engine.runner.host_memory`). The pieces give
    the same rows (each row's products are its own; bit for bit in bfloat16, while float32's
    BLAS may pick another kernel for fewer rows and round a last bit otherwise); joining them
    costs one copy of the output.

    Args:
        x: (B, T', W). Returns: (B, T', W).
    """
    ffn = block.ffn
    rows = x.reshape(-1, x.size(-1))  # (B * T', W)
    piece = max(1, FFN_PIECE_BYTES // (ffn.up.out_features * x.element_size()))
    if rows.size(0) <= piece:
        hidden = linear(ffn.norm(x), ffn.up, gelu=True)  # (B, T', 4W)
        return linear(hidden, ffn.down, residual=x)  # (B, T', W)
    pieces = []
    for part in rows.split(piece):
        hidden = linear(ffn.norm(part), ffn.up, gelu=True)  # (R, 4W)
        pieces.append(linear(hidden, ffn.down, residual=part))
    return torch.cat(pieces).view(x.shape)
