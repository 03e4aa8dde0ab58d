"""WeNet's conv-cache layout: the specification's reference API for ``forward_chunk``.

oasr stores a stream's conv left context frames before channels, (num_layers, 1,
kernel_size - 1, hidden_dim), the layout the paged forward takes. WeNet's
``ConformerEncoder.forward_chunk`` takes and returns it transposed, (num_layers, 1, hidden_dim,
kernel_size - 1). ``CnnCacheManager`` inherits the two transposing accessors from
``WenetLayoutMixin``; only tests and the WeNet-compatible examples use them.
"""

from __future__ import annotations

from typing import Protocol

import torch


class _ConvCache(Protocol):
    def get_cache(self, stream_id: int) -> torch.Tensor: ...

    def update(self, stream_id: int, new_cnn_cache: torch.Tensor) -> None: ...


class WenetLayoutMixin:
    """WeNet-layout views of a ``CnnCacheManager`` stream's cache (no copies)."""

    def get_wenet_cache(self: _ConvCache, stream_id: int) -> torch.Tensor:
        """The stream's cache in WeNet ``forward_chunk`` layout (num_layers, 1, hidden_dim,
        kernel_size - 1): a transposed view."""
        return self.get_cache(stream_id).transpose(2, 3)

    def update_wenet(self: _ConvCache, stream_id: int, new_cnn_cache: torch.Tensor) -> None:
        """``update`` from WeNet layout (num_layers, 1, hidden_dim, kernel_size - 1)."""
        self.update(stream_id, new_cnn_cache.transpose(2, 3))
