"""Position-wise feed-forward block (used twice per Conformer block, macaron style)."""

from __future__ import annotations

from torch import Tensor, nn


class PositionwiseFeedForward(nn.Module):
    """x -> w_2(dropout(act(w_1(x)))); WeNet key names ``w_1`` / ``w_2``."""

    def __init__(self, idim: int, hidden_units: int, dropout_rate: float, activation: nn.Module):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation
        self.dropout = nn.Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, D) -> (B, T, D)."""
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


def make_activation(name: str) -> nn.Module:
    """Activation module by WeNet's ``activation_type`` name."""
    table = {"swish": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
    if name not in table:
        raise ValueError(f"activation_type {name!r} is not supported; supported: {sorted(table)}")
    return table[name]()
