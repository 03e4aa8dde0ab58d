"""One Conformer block: half FF (macaron), self-attention, convolution, half FF, final norm."""

from __future__ import annotations

from torch import Tensor, nn

from oasr.fmha import PagedKVCache
from oasr.models.attention import RelPositionAttention
from oasr.models.config import ConformerConfig
from oasr.models.convolution import ConvolutionModule
from oasr.models.feed_forward import PositionwiseFeedForward, make_activation


class ConformerEncoderLayer(nn.Module):
    """A Conformer block with WeNet's submodule names (feed_forward_macaron, self_attn,
    conv_module, feed_forward, norm_ff_macaron, norm_mha, norm_conv, norm_ff, norm_final).

    Pre-norm (``normalize_before``) or post-norm residuals; the feed-forwards are scaled by 0.5
    when macaron style is on. Holds no stream state: caches come in and go out.
    """

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        d, eps = config.output_size, config.norm_eps
        self.self_attn = RelPositionAttention(
            config.attention_heads, d, config.attention_dropout_rate,
            config.query_bias, config.key_bias, config.value_bias,
        )
        self.feed_forward = PositionwiseFeedForward(
            d, config.linear_units, config.dropout_rate, make_activation(config.activation_type)
        )
        self.feed_forward_macaron = (
            PositionwiseFeedForward(
                d, config.linear_units, config.dropout_rate,
                make_activation(config.activation_type),
            )
            if config.macaron_style
            else None
        )
        self.conv_module = (
            ConvolutionModule(
                d, config.cnn_module_kernel, make_activation(config.activation_type),
                config.cnn_module_norm, config.causal, config.conv_bias, config.conv_norm_eps,
            )
            if config.use_cnn_module
            else None
        )
        self.norm_ff = nn.LayerNorm(d, eps=eps)
        self.norm_mha = nn.LayerNorm(d, eps=eps)
        if self.feed_forward_macaron is not None:
            self.norm_ff_macaron = nn.LayerNorm(d, eps=eps)
        if self.conv_module is not None:
            self.norm_conv = nn.LayerNorm(d, eps=eps)
            self.norm_final = nn.LayerNorm(d, eps=eps)
        self.ff_scale = 0.5 if config.macaron_style else 1.0
        self.normalize_before = config.normalize_before
        self.dropout = nn.Dropout(config.dropout_rate)

    def _pre(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.normalize_before else x

    def _post(self, x: Tensor, norm: nn.Module) -> Tensor:
        return x if self.normalize_before else norm(x)

    def _feed_forwards_head(self, x: Tensor) -> Tensor:
        """The first (macaron) half-step feed-forward, when present."""
        if self.feed_forward_macaron is None:
            return x
        y = self.feed_forward_macaron(self._pre(x, self.norm_ff_macaron))
        return self._post(x + self.ff_scale * self.dropout(y), self.norm_ff_macaron)

    def _feed_forwards_tail(self, x: Tensor) -> Tensor:
        """The second feed-forward, then the block's final norm."""
        y = self.feed_forward(self._pre(x, self.norm_ff))
        x = self._post(x + self.ff_scale * self.dropout(y), self.norm_ff)
        return self.norm_final(x) if self.conv_module is not None else x

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        pos_emb: Tensor,
        mask_pad: Tensor | None = None,
        att_cache: Tensor | None = None,
        cnn_cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Dense forward.

        Args:
            x: (B, T, D); mask: (B, 1|T, L) bool or empty; pos_emb: (1, L, D);
            mask_pad: (B, 1, T) bool or None; att_cache: (B, H, T_cache, 2 d_k) or None;
            cnn_cache: (B, D, kernel - 1) or None.
        Returns:
            x (B, T, D), new_att_cache (B, H, T_cache + T, 2 d_k), new_cnn_cache (B, D, k - 1).
        """
        x = self._feed_forwards_head(x)
        y, new_att = self.self_attn(self._pre(x, self.norm_mha), mask, pos_emb, att_cache)
        x = self._post(x + self.dropout(y), self.norm_mha)
        new_cnn = x.new_zeros((0, 0, 0))
        if self.conv_module is not None:
            y, new_cnn = self.conv_module(self._pre(x, self.norm_conv), mask_pad, cnn_cache)
            x = self._post(x + self.dropout(y), self.norm_conv)
        return self._feed_forwards_tail(x), new_att, new_cnn

    def forward_paged(
        self,
        x: Tensor,
        lengths: Tensor,
        kv_cache: PagedKVCache,
        pos_table: Tensor,
        key_positions: Tensor,
        cnn_cache: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Chunk forward of B streams through the paged K/V cache and slot-layout conv state.

        Args:
            x: (B, T, D); lengths: (B,) valid frames; kv_cache: this layer's PagedKVCache;
            pos_table: (N, H, d_k); key_positions: (B, L) int64; cnn_cache: (B, k - 1, D).
        Returns:
            x (B, T, D), new_cnn_cache (B, k - 1, D).
        """
        x = self._feed_forwards_head(x)
        y = self.self_attn.forward_paged(
            self._pre(x, self.norm_mha), kv_cache, lengths, pos_table, key_positions
        )
        x = self._post(x + self.dropout(y), self.norm_mha)
        new_cnn = cnn_cache
        if self.conv_module is not None:
            y, new_cnn = self.conv_module.forward_slot(
                self._pre(x, self.norm_conv), lengths, cnn_cache
            )
            x = self._post(x + self.dropout(y), self.norm_conv)
        return self._feed_forwards_tail(x), new_cnn
