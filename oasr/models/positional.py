"""Sinusoidal relative-position table for the Conformer's position-aware attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

INITIAL_TABLE_POSITIONS = 5000


def sinusoid_table(num_positions: int, dim: int, device: torch.device | None = None) -> Tensor:
    """(num_positions, dim) float32: sin in even dims, cos in odd dims (WeNet's layout)."""
    position = torch.arange(0, num_positions, dtype=torch.float32, device=device).unsqueeze(1)
    div_term = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / dim)
    )
    table = torch.zeros(num_positions, dim, dtype=torch.float32, device=device)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


class RelPositionalEncoding(nn.Module):
    """Scales the subsampled input by sqrt(D) and serves absolute-position embeddings.

    The table ``pe`` (num_positions, D) starts at 5000 positions and doubles whenever a later
    position is asked for, so streams have no length limit. It is a non-persistent buffer:
    derived from D alone, it is never saved; it follows ``.to(device)`` but stays float32.
    """

    def __init__(self, d_model: int, dropout_rate: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.pe: Tensor
        self.register_buffer(
            "pe", sinusoid_table(INITIAL_TABLE_POSITIONS, d_model), persistent=False
        )

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> RelPositionalEncoding:
        # Keep the table float32 through .half() / .to(dtype): positions past ~2000 need the
        # precision; users cast the slices they take.
        table = self.pe
        out = super()._apply(fn, recurse)
        self.pe = table.to(device=self.pe.device)
        return out

    @property
    def num_positions(self) -> int:
        return self.pe.size(0)

    def scale(self, x: Tensor) -> Tensor:
        """x: (B, T, D) -> (B, T, D) * sqrt(D) (dropout in training)."""
        return self.dropout(x * self.xscale)

    def ensure_positions(self, num_positions: int) -> None:
        """Grow the table (doubling) until it holds ``num_positions`` positions."""
        if num_positions <= self.num_positions:
            return
        size = self.num_positions
        while size < num_positions:
            size *= 2
        # A table grown inside an inference_mode engine step must stay usable for training.
        with torch.inference_mode(False):
            self.pe = sinusoid_table(size, self.d_model, device=self.pe.device)

    def table(self, num_positions: int) -> Tensor:
        """(num_positions', D) float32 table covering at least ``num_positions`` positions."""
        self.ensure_positions(num_positions)
        return self.pe

    def position_encoding(self, offset: int, size: int) -> Tensor:
        """(1, size, D) float32: embeddings of absolute positions offset .. offset + size - 1."""
        if offset < 0:
            raise ValueError(f"position offset must be >= 0, got {offset}")
        self.ensure_positions(offset + size)
        return self.dropout(self.pe[offset : offset + size].unsqueeze(0))
