"""The causal depthwise conv's left context: the single-spec instance of ``SlotStateCache``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oasr.cache.reference.wenet_layout import WenetLayoutMixin
from oasr.cache.slot_state import SlotStateCache
from oasr.cache.state_spec import StreamStateSpec
from oasr.cache.types import CacheConfig

CNN_STATE = "cnn"


def cnn_state_spec(num_layers: int, cache_frames: int, hidden_dim: int) -> StreamStateSpec:
    """The causal depthwise conv's left context, declared once here: ``"cnn"``, per stream
    (num_layers, kernel_size - 1, hidden_dim) with the slot on axis 1 (the layout the paged
    chunk forward takes). `CnnCacheManager` stores it; an encoder with such a conv lists it in
    its ``streaming_state_specs``."""
    return StreamStateSpec(CNN_STATE, (num_layers, cache_frames, hidden_dim), slot_axis=1)


class CnnCacheManager(WenetLayoutMixin, SlotStateCache):
    """Per-layer conv left context of every stream, overwritten in place each chunk.

    One declared spec, ``"cnn"``: per stream (num_layers, kernel_size - 1, hidden_dim) with the
    slot on axis 1, so ``buffer`` is (num_layers, max_batch_size + pad_lanes, kernel_size - 1,
    hidden_dim): a batch's conv cache is ``buffer.index_select(1, slots)``, the layout the
    paged chunk forward takes. Fixed size per stream, so no paging; allocation zeroes the slot
    (a zero left context is what an offline pass pads with). WeNet's transposed layout
    (``get_wenet_cache``, ``update_wenet``) comes from ``oasr.cache.reference.wenet_layout``.
    """

    def __init__(self, config: CacheConfig, pad_lanes: int = 0) -> None:
        spec = cnn_state_spec(config.num_layers, config.cnn_cache_frames, config.hidden_dim)
        super().__init__([spec], config.max_batch_size, config.device, config.dtype, pad_lanes)
        self.config = config

    @property
    def buffer(self) -> torch.Tensor:
        """(num_layers, max_batch_size + pad_lanes, kernel_size - 1, hidden_dim), persistent."""
        return self.buffers[CNN_STATE]

    @property
    def stream_shape(self) -> tuple[int, int, int, int]:
        """Shape of one stream's cache: (num_layers, 1, kernel_size - 1, hidden_dim)."""
        cfg = self.config
        return (cfg.num_layers, 1, cfg.cnn_cache_frames, cfg.hidden_dim)

    def get_cache(self, stream_id: int) -> torch.Tensor:
        """The stream's cache, (num_layers, 1, kernel_size - 1, hidden_dim): a view of ``buffer``."""
        return self.slot_view(stream_id, CNN_STATE)

    def update(self, stream_id: int, new_cnn_cache: torch.Tensor) -> None:
        """Overwrite the stream's cache in place.

        Args:
            new_cnn_cache: (num_layers, 1, kernel_size - 1, hidden_dim).
        Raises:
            ValueError: any other shape (both shapes in the message). KeyError: unknown stream.
        """
        view = self.get_cache(stream_id)
        if tuple(new_cnn_cache.shape) != self.stream_shape:
            raise ValueError(
                f"cnn cache update for stream {stream_id}: got shape {tuple(new_cnn_cache.shape)}, "
                f"expected {self.stream_shape}"
            )
        view.copy_(new_cnn_cache)

    def gather(self, stream_ids: Sequence[int], pad_to: int | None = None) -> torch.Tensor:
        """(num_layers, B, kernel_size - 1, hidden_dim) caches of a batch (a new tensor)."""
        return self.views(stream_ids, pad_to)[CNN_STATE].gather()

    def scatter(
        self, stream_ids: Sequence[int], new_cnn_cache: torch.Tensor, pad_to: int | None = None
    ) -> None:
        """Write a batch's (num_layers, B, kernel_size - 1, hidden_dim) caches back in place
        (B counts the pad rows when ``pad_to`` is given).

        Raises:
            ValueError: wrong shape.
        """
        self.views(stream_ids, pad_to)[CNN_STATE].scatter(new_cnn_cache)
