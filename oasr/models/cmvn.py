"""Global CMVN: per-dimension mean/variance normalisation of fbank features inside the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor, nn


class GlobalCMVN(nn.Module):
    """``(x - mean) * istd`` over the feature axis.

    ``mean`` and ``istd`` are persistent buffers (WeNet key names ``global_cmvn.mean`` /
    ``global_cmvn.istd``), so a checkpoint carries its statistics; defaults are the identity.
    """

    mean: Tensor
    istd: Tensor

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("istd", torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, dim) -> (B, T, dim), computed in x's dtype (float32 fbank)."""
        return (x - self.mean.to(x.dtype)) * self.istd.to(x.dtype)

    def set_stats(self, mean: Tensor, istd: Tensor) -> None:
        """Copy statistics in place; both must be (dim,)."""
        if mean.shape != self.mean.shape or istd.shape != self.istd.shape:
            raise ValueError(
                f"CMVN stats have shapes mean {tuple(mean.shape)} istd {tuple(istd.shape)}, "
                f"the model expects ({self.mean.numel()},)"
            )
        with torch.no_grad():
            self.mean.copy_(mean)
            self.istd.copy_(istd)


def load_cmvn(path: str | Path) -> tuple[Tensor, Tensor]:
    """Read global CMVN statistics from a WeNet JSON file or a Kaldi text stats matrix.

    JSON: ``{"mean_stat": [...], "var_stat": [...], "frame_num": n}``. Kaldi text: the 2 x (D+1)
    matrix ``[ sums... count \\n squares... 0 ]``.

    Returns:
        mean (D,) float32, istd (D,) float32, with the variance floored at 1e-20.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CMVN file not found: {path}")
    text = path.read_text()
    if text.lstrip().startswith("{"):
        stats = json.loads(text)
        missing = [k for k in ("mean_stat", "var_stat", "frame_num") if k not in stats]
        if missing:
            raise KeyError(f"CMVN JSON {path} lacks keys {missing}")
        sums, squares, count = stats["mean_stat"], stats["var_stat"], float(stats["frame_num"])
    else:
        sums, squares, count = _parse_kaldi_stats(text, path)
    if len(sums) != len(squares) or count <= 0:
        raise ValueError(
            f"CMVN file {path}: {len(sums)} mean stats, {len(squares)} var stats, count {count}"
        )
    mean = [s / count for s in sums]
    var = [max(q / count - m * m, 1.0e-20) for q, m in zip(squares, mean, strict=True)]
    istd = [1.0 / math.sqrt(v) for v in var]
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(istd, dtype=torch.float32)


def _parse_kaldi_stats(text: str, path: Path) -> tuple[list[float], list[float], float]:
    rows = []
    for line in text.replace("[", " ").replace("]", "\n").splitlines():
        values = line.split()
        if values:
            rows.append([float(v) for v in values])
    if len(rows) != 2 or len(rows[0]) != len(rows[1]) or len(rows[0]) < 2:
        raise ValueError(
            f"Kaldi CMVN file {path}: expected a 2 x (D+1) stats matrix, got rows of "
            f"{[len(r) for r in rows]}"
        )
    return rows[0][:-1], rows[1][:-1], rows[0][-1]
