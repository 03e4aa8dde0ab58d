"""ConformerEncoder: CMVN -> conv2d 4x subsampling -> Conformer blocks -> final norm.

Three forwards with one set of weights:
- ``forward``: whole utterances with padding and chunk masks (training, offline decoding);
- ``forward_chunk``: one stream, one chunk, dense caches in WeNet's layout;
- ``forward_chunk_paged``: B streams at their own offsets, K/V in the paged pool, conv state in
  the slot layout. All three agree to float32 rounding on the same audio.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from oasr.cache.cnn_cache import CNN_STATE, cnn_state_spec
from oasr.cache.slot_state import HeldState, StateView
from oasr.cache.state_spec import StreamStateSpec
from oasr.fmha import PagedKVCache, gather_length
from oasr.models.cmvn import GlobalCMVN
from oasr.models.config import ConformerConfig
from oasr.models.encoder_layer import ConformerEncoderLayer
from oasr.models.masks import add_chunk_mask, make_pad_mask, pick_chunk_geometry
from oasr.models.subsampling import Conv2dSubsampling4


class ConformerEncoder(nn.Module):
    """Streaming Conformer encoder, parameter names as WeNet's ``encoder.*`` keys.

    Holds no stream state: every streaming forward takes the caches in and returns new ones.
    """

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.global_cmvn = GlobalCMVN(config.input_dim) if config.use_global_cmvn else None
        self.embed = Conv2dSubsampling4(
            config.input_dim, config.output_size, config.positional_dropout_rate
        )
        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(config) for _ in range(config.num_blocks)
        )
        self.after_norm = nn.LayerNorm(config.output_size, eps=config.norm_eps)

    @property
    def layers(self) -> list[ConformerEncoderLayer]:
        """The Conformer blocks, typed."""
        return [layer for layer in self.encoders if isinstance(layer, ConformerEncoderLayer)]

    def output_size(self) -> int:
        return self.config.output_size

    def _front(self, xs: Tensor) -> Tensor:
        """(B, T, F) fbank -> (B, T', D) subsampled, scaled embeddings."""
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        return self.embed(xs.to(self.embed.dtype))

    def _finish(self, xs: Tensor) -> Tensor:
        return self.after_norm(xs) if self.config.normalize_before else xs

    def forward(
        self,
        xs: Tensor,
        xs_lens: Tensor,
        decoding_chunk_size: int = 0,
        num_decoding_left_chunks: int = -1,
    ) -> tuple[Tensor, Tensor]:
        """Full-utterance forward with padding and chunk masks.

        Args:
            xs: (B, T, input_dim) raw fbank (CMVN is applied here).
            xs_lens: (B,) fbank frames per row.
            decoding_chunk_size: > 0 chunk mask of that many encoder frames; < 0 full context;
                0 = the training behaviour (dynamic chunk when training with
                ``use_dynamic_chunk``, else ``static_chunk_size``, else full context).
            num_decoding_left_chunks: visible earlier chunks; < 0 all.
            As in WeNet, ``decoding_chunk_size`` only applies to ``use_dynamic_chunk`` models;
            otherwise ``static_chunk_size`` (if > 0) is used, else no chunk mask at all.
        Returns:
            ys (B, T', D), masks (B, 1, T') bool with True at real frames.
        """
        masks = ~make_pad_mask(xs_lens.to(xs.device), xs.size(1)).unsqueeze(1)  # (B, 1, T)
        xs = self._front(xs)  # (B, T', D)
        masks = self.embed.subsample_mask(masks)  # (B, 1, T')
        pos_emb = self.embed.pos_enc.position_encoding(0, xs.size(1))  # (1, T', D)
        cfg = self.config
        geometry = pick_chunk_geometry(
            xs.size(1), cfg.use_dynamic_chunk, cfg.use_dynamic_left_chunk, decoding_chunk_size,
            cfg.static_chunk_size, num_decoding_left_chunks, self.training,
            max_chunk_size=100 // self.embed.subsampling_rate,
        )
        chunk_masks = add_chunk_mask(masks, geometry)  # (B, T', T') or (B, 1, T')
        for layer in self.layers:
            xs, _, _ = layer(xs, chunk_masks, pos_emb, masks)
        return self._finish(xs), masks

    def _require_streamable(self) -> None:
        if not self.config.is_streamable():
            raise ValueError(
                "chunk-by-chunk streaming needs a causal convolution module (causal: true) or "
                f"no convolution module; this model has causal={self.config.causal}, "
                f"use_cnn_module={self.config.use_cnn_module}"
            )

    def forward_chunk(
        self,
        xs: Tensor,
        offset: int,
        required_cache_size: int,
        att_cache: Tensor | None = None,
        cnn_cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One chunk of one stream with dense caches (WeNet's signature and cache layouts).

        Args:
            xs: (1, T, input_dim) one chunk window of raw fbank (>= 7 frames).
            offset: encoder frames this stream produced before this chunk.
            required_cache_size: history frames to keep; < 0 all, 0 none.
            att_cache: (num_blocks, H, T_cache, 2 d_k) or None / empty for a fresh stream.
            cnn_cache: (num_blocks, 1, D, kernel - 1) or None / empty.
        Returns:
            ys (1, T', D), att_cache (num_blocks, H, T_kept, 2 d_k),
            cnn_cache (num_blocks, 1, D, kernel - 1).
        """
        self._require_streamable()
        if xs.size(0) != 1:
            raise ValueError(f"forward_chunk takes one stream, got batch {xs.size(0)}")
        xs = self._front(xs)  # (1, T', D)
        att = att_cache if att_cache is not None and att_cache.size(0) > 0 else None
        cnn = cnn_cache if cnn_cache is not None and cnn_cache.size(0) > 0 else None
        cache_t1 = att.size(2) if att is not None else 0
        key_size = cache_t1 + xs.size(1)
        pos_emb = self.embed.pos_enc.position_encoding(int(offset) - cache_t1, key_size)
        if required_cache_size < 0:
            next_start = 0
        elif required_cache_size == 0:
            next_start = key_size
        else:
            next_start = max(key_size - required_cache_size, 0)
        no_mask = torch.ones((0, 0, 0), dtype=torch.bool, device=xs.device)
        new_att, new_cnn = [], []
        for i, layer in enumerate(self.layers):
            xs, layer_att, layer_cnn = layer(
                xs, no_mask, pos_emb, None,
                att[i : i + 1] if att is not None else None,
                cnn[i] if cnn is not None else None,
            )
            new_att.append(layer_att[:, :, next_start:, :])
            new_cnn.append(layer_cnn.unsqueeze(0))
        return self._finish(xs), torch.cat(new_att, dim=0), torch.cat(new_cnn, dim=0)

    @property
    def streaming_state_specs(self) -> tuple[StreamStateSpec, ...]:
        """The fixed-extent per-stream state `forward_chunk_paged` reads by name from
        ``states``: ``"cnn"``, every block's depthwise-conv left context,
        (num_blocks, kernel - 1, D) per stream with the stream on axis 1; none without a conv
        module. The engine allocates, zeroes, gathers, scatters and resets what is declared
        here; a subclass that declares more reads them the same way."""
        cfg = self.config
        if not cfg.use_cnn_module:
            return ()
        return (cnn_state_spec(cfg.num_blocks, cfg.cnn_cache_frames, cfg.output_size),)

    def forward_chunk_paged(
        self,
        xs: Tensor,
        xs_lens: Tensor,
        offsets: Tensor,
        att_caches: list[PagedKVCache],
        cnn_cache: Tensor | None = None,
        max_offset: int | None = None,
        cache_t1: Tensor | None = None,
        *,
        states: Mapping[str, StateView] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One chunk of B streams, each at its own offset and cached length, in one call.

        Each layer writes the chunk's K/V into the pool (frames ``cache_seqlens[b] + t``) and
        attends over the row's history plus the chunk. The caller allocated the blocks before
        (``prepare_chunks_batched``) and commits ``ys_lens`` frames after.

        Args:
            xs: (B, T, input_dim) raw fbank windows, rows padded past ``xs_lens``.
            xs_lens: (B,) fbank frames per row (>= 7).
            offsets: (B,) int64 encoder-frame offset of each row's chunk start.
            att_caches: one PagedKVCache per block; key j of row b sits at absolute position
                ``offsets[b] - cache_seqlens[b] + j``.
            cnn_cache: (num_blocks, B, kernel - 1, D) conv state (slot layout); an empty tensor
                means zeros (fresh streams). Not with ``states``.
            max_offset: host-side ``offsets.max()`` if the caller knows it (avoids a sync).
            cache_t1: (B,) int frames of history each row holds (``cached_frames``); None reads
                them from ``att_caches[0].cache_seqlens``, which is the same tensor's value.
            states: the declared state (`streaming_state_specs`) by name, one gather/scatter
                view each (the engine's): the conv state is gathered from ``states["cnn"]``
                and the new one scattered back into it.
        Returns:
            ys (B, T', D) (rows past ``ys_lens`` are padding), ys_lens (B,),
            new_cnn_cache (num_blocks, B, kernel - 1, D).
        Raises:
            ValueError: both or neither of ``cnn_cache`` and ``states``, a wrong cache shape
                or count.
        """
        self._require_streamable()
        if (cnn_cache is None) == (states is None):
            raise ValueError("pass the conv state as cnn_cache (a tensor) or in states (views "
                             "by name), not both or neither")
        view = HeldState(cnn_cache) if cnn_cache is not None else states.get(CNN_STATE)  # type: ignore[union-attr]
        if len(att_caches) != len(self.encoders):
            raise ValueError(f"got {len(att_caches)} PagedKVCaches for {len(self.encoders)} blocks")
        ys_lens = self.embed.output_lengths(xs_lens.to(xs.device))  # (B,)
        xs = self._front(xs)  # (B, T', D)
        b, t, d = xs.shape
        cnn_cache = self._slot_cnn_cache(view.gather() if view is not None else xs.new_zeros(0),
                                         b, xs)
        top = int(offsets.max()) if max_offset is None else int(max_offset)
        pe = self.embed.pos_enc.table(top + t)  # (N, D)
        key_positions = self._key_positions(
            att_caches[0], offsets, t, pe.size(0), cache_t1
        )  # (B, L)
        new_cnn = []
        for i, layer in enumerate(self.layers):
            table = layer.self_attn.projected_positions(pe)  # (N, H, d_k)
            xs, layer_cnn = layer.forward_paged(
                xs, ys_lens, att_caches[i], table, key_positions, cnn_cache[i]
            )
            new_cnn.append(layer_cnn)
        new = torch.stack(new_cnn, dim=0)  # (num_blocks, B, kernel - 1, D)
        if view is not None:
            view.scatter(new)
        return self._finish(xs), ys_lens, new

    @staticmethod
    def _key_positions(
        cache: PagedKVCache, offsets: Tensor, num_frames: int, num_positions: int,
        cache_t1: Tensor | None = None,
    ) -> Tensor:
        """(B, L) int64 absolute position of each gathered key column, clamped into the table."""
        length = gather_length(cache, num_frames)
        device = cache.cache_seqlens.device
        held = cache.cache_seqlens if cache_t1 is None else cache_t1
        if tuple(held.shape) != tuple(cache.cache_seqlens.shape):
            raise ValueError(
                f"cache_t1 has shape {tuple(held.shape)}, expected {tuple(cache.cache_seqlens.shape)}"
                " (one held-history length per row)"
            )
        start = offsets.to(device).long() - held.to(device).long()  # (B,)
        cols = torch.arange(length, device=device)
        return (start.unsqueeze(1) + cols).clamp_(0, num_positions - 1)

    def _slot_cnn_cache(self, cnn_cache: Tensor, batch: int, xs: Tensor) -> Tensor:
        frames = self.config.cnn_cache_frames
        shape = (len(self.encoders), batch, frames, self.config.output_size)
        if cnn_cache.numel() == 0:
            return xs.new_zeros(shape)
        if tuple(cnn_cache.shape) != shape:
            raise ValueError(
                f"cnn_cache has shape {tuple(cnn_cache.shape)}, expected {shape} "
                "(num_blocks, B, kernel - 1, D)"
            )
        return cnn_cache
