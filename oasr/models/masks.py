"""Padding and chunk masks for the full-utterance (training / offline) encoder forward.

Masks are boolean with True = "may attend / is a real frame", the convention of WeNet's
encoder, so chunk-masked full forwards match chunk-by-chunk streaming exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor


def make_pad_mask(lengths: Tensor, max_len: int = 0) -> Tensor:
    """Padding mask from lengths.

    Args:
        lengths: (B,) int frames per row.
        max_len: width of the mask; 0 means ``lengths.max()``.
    Returns:
        (B, max_len) bool, True at padded positions.
    """
    width = max_len if max_len > 0 else int(lengths.max())
    steps = torch.arange(width, device=lengths.device)
    return steps.unsqueeze(0) >= lengths.unsqueeze(1)


def subsequent_chunk_mask(
    size: int, chunk_size: int, num_left_chunks: int = -1, device: torch.device | None = None
) -> Tensor:
    """Chunk attention mask: frame i sees its own chunk, earlier chunks, and no later ones.

    Args:
        size: number of frames.
        chunk_size: frames per chunk (>= 1).
        num_left_chunks: earlier chunks visible; < 0 means all of them.
    Returns:
        (size, size) bool, ``mask[i, j]`` True when query i may attend key j.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    idx = torch.arange(size, device=device)
    chunk_idx = idx // chunk_size
    end = (chunk_idx + 1) * chunk_size  # (size,)
    if num_left_chunks < 0:
        start = torch.zeros_like(end)
    else:
        start = ((chunk_idx - num_left_chunks) * chunk_size).clamp(min=0)
    keys = idx.unsqueeze(0)  # (1, size)
    return (keys >= start.unsqueeze(1)) & (keys < end.unsqueeze(1))


def pick_chunk_geometry(
    max_len: int,
    use_dynamic_chunk: bool,
    use_dynamic_left_chunk: bool,
    decoding_chunk_size: int,
    static_chunk_size: int,
    num_decoding_left_chunks: int,
    training: bool,
    max_chunk_size: int = 25,
) -> tuple[int, int] | None:
    """Chunk size and left-chunk count for one forward, or None for no chunk mask.

    Decoding (``decoding_chunk_size`` != 0): < 0 is full context, > 0 that chunk size with
    ``num_decoding_left_chunks``. Dynamic-chunk training (``decoding_chunk_size == 0`` while
    training): a random chunk, full context with probability ~1/2, else 1..max_chunk_size, and
    random left chunks when ``use_dynamic_left_chunk``. In eval, 0 falls back to the static
    chunk size (or full context), never to a random mask.
    """
    if use_dynamic_chunk:
        if decoding_chunk_size < 0:
            return max_len, -1
        if decoding_chunk_size > 0:
            return decoding_chunk_size, num_decoding_left_chunks
        if training:
            return _random_training_chunk(max_len, use_dynamic_left_chunk, max_chunk_size)
    if static_chunk_size > 0:
        return static_chunk_size, num_decoding_left_chunks
    if use_dynamic_chunk:
        return max_len, -1
    return None


def _random_training_chunk(
    max_len: int, use_dynamic_left_chunk: bool, max_chunk_size: int
) -> tuple[int, int]:
    chunk_size = int(torch.randint(1, max(max_len, 2), (1,)).item())
    if chunk_size > max_len // 2:
        return max_len, -1
    chunk_size = chunk_size % max_chunk_size + 1
    num_left_chunks = -1
    if use_dynamic_left_chunk:
        max_left_chunks = (max_len - 1) // chunk_size
        num_left_chunks = int(torch.randint(0, max(max_left_chunks, 1), (1,)).item())
    return chunk_size, num_left_chunks


def add_chunk_mask(masks: Tensor, geometry: tuple[int, int] | None) -> Tensor:
    """Combine a padding mask with a chunk mask.

    Args:
        masks: (B, 1, T) bool, True at real frames.
        geometry: (chunk_size, num_left_chunks) or None for padding only.
    Returns:
        (B, T, T) bool (or the (B, 1, T) input when geometry is None). Rows that would see no
        key at all (padded queries past every visible key) are set all-True; their outputs are
        padding and are masked downstream.
    """
    if geometry is None:
        return masks
    chunk_size, num_left_chunks = geometry
    size = masks.size(-1)
    chunk = subsequent_chunk_mask(size, chunk_size, num_left_chunks, masks.device)
    chunk_masks = masks & chunk.unsqueeze(0)  # (B, T, T)
    empty = chunk_masks.sum(dim=-1, keepdim=True) == 0  # (B, T, 1)
    return chunk_masks | empty
