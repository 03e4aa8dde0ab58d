"""AsrModel: a ConformerEncoder with a CTC head, its config and its vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from oasr.models.config import ConformerConfig
from oasr.models.conformer import ConformerEncoder
from oasr.models.ctc import CTC


class AsrModel(nn.Module):
    """Encoder + CTC head (state_dict keys ``encoder.*`` / ``ctc.ctc_lo.*``, as WeNet's).

    ``units[i]`` is the token of CTC output ``i``; when given, its length must equal
    ``config.vocab_size``. The tokenizer is built from the units on first use.
    """

    def __init__(
        self,
        config: ConformerConfig,
        units: Sequence[str] | None = None,
        bpe_model: str | Path | None = None,
    ) -> None:
        super().__init__()
        if units is not None and len(units) != config.vocab_size:
            raise ValueError(
                f"{len(units)} units for a model with vocab_size {config.vocab_size}"
            )
        self.config = config
        self.encoder = ConformerEncoder(config)
        self.ctc = CTC(config.vocab_size, config.output_size, config.ctc_blank_id)
        self.units: list[str] | None = list(units) if units is not None else None
        self.bpe_model: Path | None = Path(bpe_model) if bpe_model is not None else None
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """CharTokenizer / BpeTokenizer over ``units`` (None without units)."""
        if self._tokenizer is None and self.units is not None:
            from oasr.decoding.tokenizer import BpeTokenizer, CharTokenizer

            if self.bpe_model is not None:
                self._tokenizer = BpeTokenizer(self.units, self.bpe_model)
            else:
                self._tokenizer = CharTokenizer(self.units)
        return self._tokenizer

    def forward(
        self,
        xs: Tensor,
        xs_lens: Tensor,
        decoding_chunk_size: int = 0,
        num_decoding_left_chunks: int = -1,
    ) -> tuple[Tensor, Tensor]:
        """Full-utterance encoder forward.

        Args:
            xs: (B, T, input_dim) raw fbank; xs_lens: (B,) frames per row; chunk arguments as
                ``ConformerEncoder.forward``.
        Returns:
            enc (B, T', D), enc_lens (B,) valid encoder frames per row.
        """
        enc, masks = self.encoder(xs, xs_lens, decoding_chunk_size, num_decoding_left_chunks)
        return enc, masks.squeeze(1).sum(dim=1)

    def ctc_log_probs(self, enc: Tensor) -> Tensor:
        """enc: (B, T', D) -> (B, T', vocab_size) float32 CTC log-probabilities."""
        return self.ctc.log_softmax(enc)

    def ctc_loss(self, enc: Tensor, enc_lens: Tensor, ys: Tensor, ys_lens: Tensor) -> Tensor:
        """Batch-mean CTC loss; shapes as ``CTC.loss``."""
        return self.ctc.loss(enc, enc_lens, ys, ys_lens)
