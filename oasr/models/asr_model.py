"""AsrModel: a ConformerEncoder with a CTC head, its config and its vocabulary.

The model-level streaming entry points (``forward_chunk_paged``, ``forward_chunk``) are the
ones the cache specification's usage examples call: chunk in, CTC log-probs and new caches out.
Both take and return the conv cache in the cache layer's layout, (num_blocks, B, kernel - 1, D)
(frames before channels, the stream on axis 1), which is what ``StreamContext.get_cnn_cache``
and ``CnnCacheManager`` hold; WeNet's (num_blocks, 1, D, kernel - 1) layout exists only at
``ConformerEncoder.forward_chunk``, the WeNet-compatible boundary. An empty tensor (the
``(0, 0, 0, 0)`` placeholder of a stream's first chunk) means zeros for either cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from oasr.models.config import ConformerConfig
from oasr.models.conformer import ConformerEncoder
from oasr.models.ctc import CTC

if TYPE_CHECKING:
    from oasr.fmha import PagedKVCache


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
            from oasr.text.tokenizer import BpeTokenizer, CharTokenizer

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

    # ---------------------------------------------------------------- streaming entry points

    def _check_cnn_cache(self, cnn_cache: Tensor, batch: int) -> None:
        cfg = self.config
        expected = (cfg.num_blocks, batch, cfg.cnn_cache_frames, cfg.output_size)
        if cnn_cache.numel() > 0 and tuple(cnn_cache.shape) != expected:
            raise ValueError(
                f"cnn_cache has shape {tuple(cnn_cache.shape)}, expected {expected} "
                "(num_blocks, B, kernel - 1, D) as StreamContext.get_cnn_cache returns it, or "
                "an empty (0, 0, 0, 0) placeholder; WeNet's (num_blocks, 1, D, kernel - 1) layout "
                "goes to ConformerEncoder.forward_chunk instead"
            )

    def forward_chunk_paged(
        self,
        chunk: Tensor,
        offset: int | Tensor,
        att_caches: list[PagedKVCache],
        cnn_cache: Tensor,
        cache_t1: Tensor | None = None,
        chunk_lens: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One chunk of B streams through the paged K/V pool, CTC log-probs out.

        Writes each layer's K/V for the chunk into the blocks the caller prepared
        (``prepare_chunk`` / ``prepare_chunks_batched``); the caller commits
        ``log_probs.size(1)`` frames after (``commit_chunk_paged``).

        Args:
            chunk: (B, T, input_dim) raw fbank windows (>= 7 frames).
            offset: encoder frames each stream produced before this chunk: a host int shared
                by all rows, or (B,) int per row.
            att_caches: one ``PagedKVCache`` per encoder block, B rows.
            cnn_cache: (num_blocks, B, kernel - 1, D), or an empty placeholder for zeros.
            cache_t1: (B,) int frames of history each row holds (``cached_frames``), not its
                offset: with eviction the offset grows while the held history does not. None
                reads ``att_caches[0].cache_seqlens``.
            chunk_lens: (B,) fbank frames per row when rows are padded; None = all T.
        Returns:
            log_probs (B, T', vocab_size) float32 (rows padded past their own length when
            ``chunk_lens`` differ), new_cnn (num_blocks, B, kernel - 1, D).
        """
        batch = chunk.size(0)
        self._check_cnn_cache(cnn_cache, batch)
        device = chunk.device
        if chunk_lens is None:
            chunk_lens = torch.full((batch,), chunk.size(1), dtype=torch.long, device=device)
        max_offset: int | None = None
        if isinstance(offset, Tensor):
            offsets = offset.to(device).long().reshape(batch)
        else:
            offsets = torch.full((batch,), int(offset), dtype=torch.long, device=device)
            max_offset = int(offset)
        ys, _, new_cnn = self.encoder.forward_chunk_paged(
            chunk, chunk_lens, offsets, att_caches, cnn_cache.to(self.encoder.embed.dtype),
            max_offset=max_offset, cache_t1=cache_t1,
        )
        return self.ctc_log_probs(ys), new_cnn

    def forward_chunk(
        self,
        chunk: Tensor,
        offset: int,
        required_cache_size: int,
        att_cache: Tensor | None = None,
        cnn_cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One chunk of one stream with dense caches (the legacy, non-paged path).

        Args:
            chunk: (1, T, input_dim) raw fbank window (>= 7 frames).
            offset: encoder frames the stream produced before this chunk.
            required_cache_size: history frames to return in ``new_att``; < 0 all, 0 none.
            att_cache: (num_blocks, H, T_cache, 2 d_k) packed K|V history
                (``StreamContext.get_att_cache``), or None / empty for a fresh stream.
            cnn_cache: (num_blocks, 1, kernel - 1, D) (``StreamContext.get_cnn_cache``), or
                None / empty for zeros.
        Returns:
            log_probs (1, T', vocab_size) float32, new_att (num_blocks, H, T_kept, 2 d_k) whose
            last T' frames are the chunk's K|V, new_cnn (num_blocks, 1, kernel - 1, D) (the
            input, or zeros, when the model has no conv module).
        """
        dtype = self.encoder.embed.dtype
        wenet_cnn = None
        if cnn_cache is not None and cnn_cache.numel() > 0:
            self._check_cnn_cache(cnn_cache, 1)
            wenet_cnn = cnn_cache.to(dtype).transpose(2, 3)  # (L, 1, D, k - 1)
        att = att_cache.to(dtype) if att_cache is not None and att_cache.numel() > 0 else None
        ys, new_att, new_cnn = self.encoder.forward_chunk(
            chunk, offset, required_cache_size, att, wenet_cnn
        )
        if new_cnn.numel() == 0:  # no conv module: the cache passes through, as paged
            cfg = self.config
            shape = (cfg.num_blocks, 1, cfg.cnn_cache_frames, cfg.output_size)
            kept = cnn_cache if cnn_cache is not None and cnn_cache.numel() > 0 else None
            return self.ctc_log_probs(ys), new_att, kept if kept is not None else ys.new_zeros(shape)
        return self.ctc_log_probs(ys), new_att, new_cnn.transpose(2, 3)  # (L, 1, k - 1, D)
