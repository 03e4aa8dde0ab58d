"""Helpers shared by the model tests (imported by name: tests/models is on sys.path)."""

from __future__ import annotations

import numpy as np
import torch


def max_diff(a: torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    other = torch.as_tensor(b)
    assert tuple(a.shape) == tuple(other.shape), (tuple(a.shape), tuple(other.shape))
    return float((a.float() - other.float()).abs().max())
