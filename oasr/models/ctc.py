"""CTC head: a linear projection to the vocabulary plus log-softmax (and the CTC loss)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class CTC(nn.Module):
    """Linear ``ctc_lo`` (WeNet key name) from encoder width to vocabulary; blank id configurable."""

    def __init__(self, vocab_size: int, encoder_output_size: int, blank_id: int = 0) -> None:
        super().__init__()
        self.ctc_lo = nn.Linear(encoder_output_size, vocab_size)
        self.blank_id = blank_id

    def log_softmax(self, hs: Tensor) -> Tensor:
        """hs: (B, T, D) -> (B, T, V) log-probabilities, computed in float32."""
        return F.log_softmax(self.ctc_lo(hs).float(), dim=2)

    def loss(self, hs: Tensor, hs_lens: Tensor, ys: Tensor, ys_lens: Tensor) -> Tensor:
        """Summed CTC loss divided by the batch size.

        Args:
            hs: (B, T, D) encoder output; hs_lens: (B,) valid frames;
            ys: (B, U) padded target ids; ys_lens: (B,) target lengths.
        Returns:
            () scalar loss.
        """
        log_probs = self.log_softmax(hs).transpose(0, 1)  # (T, B, V)
        loss = F.ctc_loss(
            log_probs, ys, hs_lens, ys_lens, blank=self.blank_id,
            reduction="sum", zero_infinity=True,
        )
        return loss / torch.tensor(hs.size(0), dtype=loss.dtype, device=loss.device)
