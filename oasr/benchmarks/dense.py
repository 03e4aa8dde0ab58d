"""The one-stream dense baselines: a chunk of ONE stream through the model with that stream's
caches held as dense tensors and concatenated every chunk (the way WeNet's runtime serves a
stream), one per model family.

- Conformer-CTC: the model's own ``forward_chunk`` (WeNet layout: ``att_cache``
  (L, H, S, 2 d_k) concatenated with the chunk's K/V, ``cnn_cache`` (L, 1, D, k - 1)).
- Whisper-CTC: the causal conv stem with its two carried tails, then per layer the stream's K/V
  history concatenated with the chunk's and plain scaled-dot-product attention over
  [history + whole chunk] (the chunk-causal rule the model trains with), history trimmed to the
  last ``num_left_chunks`` chunks when bounded.

- Zipformer (icefall): the model's own ``streaming_step`` on a batch of one (its named state
  tensors are already dense and fixed-size: the one-stream loop is what icefall's
  ``streaming_decode.py`` does with one stream).

Each takes a chunk's feature window and the stream's offset and returns the frames its
family's decoder reads (CTC log-probabilities; a transducer's joiner-projected encoder frames)
and the stream's new caches; the old cache tensors are not modified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from oasr.models.whisper_ctc.model import WhisperCtcBlock, WhisperCtcModel
from oasr.models.whisper_ctc.streaming import conv_stem


class DenseChunkModel(Protocol):
    """One stream's chunk call with dense caches."""

    def empty_cache(self) -> Any:
        """The caches of a fresh stream."""

    def forward(self, xs: Tensor, offset: int, cache: Any) -> tuple[Tensor, Any]:
        """xs (1, T, F) one feature window, offset = encoder frames before it ->
        (log_probs (1, T', V) float32, new cache)."""


class ConformerDense:
    """The Conformer's ``encoder.forward_chunk`` (WeNet layout) + CTC head."""

    def __init__(self, model: nn.Module, chunk_size: int, num_left_chunks: int) -> None:
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.required_cache_size = chunk_size * num_left_chunks if num_left_chunks >= 0 else -1

    def empty_cache(self) -> tuple[Tensor, Tensor]:
        empty = torch.zeros(0, 0, 0, 0, device=self.device, dtype=self.dtype)
        return empty, empty

    def forward(self, xs: Tensor, offset: int,
                cache: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        ys, att, cnn = self.model.encoder.forward_chunk(  # type: ignore[union-attr, operator]
            xs, offset, self.required_cache_size, cache[0], cache[1])
        return self.model.ctc_log_probs(ys), (att, cnn)  # type: ignore[operator]


@dataclass(frozen=True)
class WhisperDenseCache:
    """One Whisper-CTC stream's dense caches.

    Attributes:
        keys, values: per layer (1, H, S, D), the stream's retained history.
        conv1: (1, 2, n_mels) conv1's left context; conv2: (1, 2, width) conv2's.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    conv1: Tensor
    conv2: Tensor


class WhisperDense:
    """A Whisper-CTC stream chunk by chunk with dense per-layer K/V, concatenated per chunk."""

    def __init__(self, model: WhisperCtcModel, chunk_size: int, num_left_chunks: int) -> None:
        self.model = model
        self.config = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.keep_frames = chunk_size * num_left_chunks if num_left_chunks >= 0 else -1

    def empty_cache(self) -> WhisperDenseCache:
        cfg = self.config
        kv = torch.zeros(1, cfg.heads, 0, cfg.head_dim, device=self.device, dtype=self.dtype)
        return WhisperDenseCache(
            (kv,) * cfg.layers, (kv,) * cfg.layers,
            torch.zeros(1, 2, cfg.n_mels, device=self.device, dtype=self.dtype),
            torch.zeros(1, 2, cfg.width, device=self.device, dtype=self.dtype))

    def forward(self, xs: Tensor, offset: int,
                cache: WhisperDenseCache) -> tuple[Tensor, WhisperDenseCache]:
        """Raises ValueError past the model's ``max_positions``."""
        model = self.model
        mel_lens = torch.tensor([xs.size(1)], device=xs.device)
        x, conv1, conv2 = conv_stem(model, xs, mel_lens, cache.conv1, cache.conv2)  # (1, T', W)
        frames = x.size(1)
        if offset + frames > self.config.max_positions:
            raise ValueError(f"positions {offset}..{offset + frames - 1} requested; the model "
                             f"has {self.config.max_positions}")
        x = x + model.positions[offset : offset + frames].to(x.dtype)
        keys, values = [], []
        for block, k_old, v_old in zip(model.blocks, cache.keys, cache.values, strict=True):
            x, k_all, v_all = self._block(block, x, k_old, v_old)  # type: ignore[arg-type]
            if self.keep_frames >= 0:
                k_all = k_all[:, :, max(0, k_all.size(2) - self.keep_frames):]
                v_all = v_all[:, :, max(0, v_all.size(2) - self.keep_frames):]
            keys.append(k_all)
            values.append(v_all)
        log_probs = model.ctc_log_probs(x)
        return log_probs, WhisperDenseCache(tuple(keys), tuple(values), conv1, conv2)

    @staticmethod
    def _block(block: WhisperCtcBlock, x: Tensor, k_old: Tensor,
               v_old: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (1, T', W), history (1, H, S, D) -> x (1, T', W), K and V (1, H, S + T', D)."""
        _, frames, width = x.shape
        heads = block.heads
        qkv = block.qkv(block.attn_norm(x)).view(1, frames, 3, heads, width // heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (1, H, T', D)
        k_all = torch.cat([k_old, k], dim=2)  # (1, H, S + T', D): a new tensor every chunk
        v_all = torch.cat([v_old, v], dim=2)
        att = F.scaled_dot_product_attention(q, k_all, v_all)  # (1, H, T', D), no mask
        x = x + block.out(att.transpose(1, 2).reshape(1, frames, width))
        return x + block.ffn(x), k_all, v_all


class ZipformerDense:
    """A Zipformer stream alone: ``streaming_step`` at batch 1 with its own named states."""

    def __init__(self, model: nn.Module) -> None:
        from oasr.engine.families.zipformer import ZipformerFamily

        self.family = ZipformerFamily(model)

    def empty_cache(self) -> dict[str, Tensor]:
        return self.family.model.init_states(1)

    def forward(self, xs: Tensor, offset: int,
                cache: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        model = self.family.model
        feats = self.family.full_windows(xs, torch.tensor([xs.shape[1]], device=xs.device))
        lens = torch.full((1,), feats.shape[1], dtype=torch.int64, device=xs.device)
        out, _, new = model.streaming_step(feats, lens, cache)  # (1, chunk / 2, C)
        if self.family.decoding == "transducer":
            return model.joiner.encoder_proj(out), new
        return model.ctc_log_probs(out), new


def dense_model_for(model: nn.Module, family: str, chunk_size: int,
                    num_left_chunks: int) -> DenseChunkModel:
    """The dense baseline of ``model``'s family (``conformer_ctc`` / ``whisper_ctc`` /
    ``zipformer``)."""
    if family == "zipformer":
        return ZipformerDense(model)
    if family == "whisper_ctc":
        return WhisperDense(model, chunk_size, num_left_chunks)  # type: ignore[arg-type]
    return ConformerDense(model, chunk_size, num_left_chunks)
