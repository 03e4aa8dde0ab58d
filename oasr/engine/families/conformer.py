"""The Conformer-CTC family (WeNet-compatible `AsrModel`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from oasr.audio import (
    ChunkGeometry,
    FeatureSource,
    StreamingFbank,
)
from oasr.cache import CacheConfig, CnnCacheManager, SlotStateCache
from oasr.cache.cnn_cache import CNN_STATE
from oasr.engine.families.base import ChunkBatch, FrameTiming, KVGeometry, ModelFamily
from oasr.models import AsrModel


class ConformerFamily(ModelFamily):
    """WeNet-compatible Conformer-CTC (`AsrModel`): fbank windows, a per-layer conv cache."""

    name = "conformer_ctc"
    model: AsrModel
    # the CTC head (31 outputs: cheap, and it ranks the tokens), the position projection
    # (applied once to the sinusoid table and cached; the attention reads its weight) and the
    # conv2d stem's output Linear (the stem stays float: it reads its dtype off that layer)
    float_linears = ("ctc.ctc_lo", "linear_pos", "embed.out.0")
    offset_sized_positions = True  # the relative table has max_offset + T rows

    @property
    def timing(self) -> FrameTiming:
        # encoder frame j reads fbank frames 4j .. 4j + 6: 6 frames (+ a window) past its own
        return FrameTiming(frame_shift_s=0.04, right_context_samples=400)

    @property
    def default_chunk_size(self) -> int:
        return 16

    @property
    def max_positions(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def kv_geometry(self) -> KVGeometry:
        cfg = self.model.config
        return KVGeometry(num_layers=cfg.num_blocks, n_kv_head=cfg.attention_heads,
                          head_dim=cfg.output_size // cfg.attention_heads,
                          hidden_dim=cfg.output_size, kernel_size=cfg.cnn_module_kernel)

    def chunk_geometry(self, chunk_size: int) -> ChunkGeometry:
        return ChunkGeometry(chunk_size=chunk_size)

    def new_features(self) -> FeatureSource:
        return StreamingFbank()

    def build_states(self, cache_config: CacheConfig, pad_lanes: int = 0) -> SlotStateCache:
        return CnnCacheManager(cache_config, pad_lanes)

    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        view = batch.states[CNN_STATE]
        ys, _, new_cnn = self.model.encoder.forward_chunk_paged(
            batch.feats, batch.feat_lens, batch.offsets, batch.caches, view.gather(),
            max_offset=batch.max_offset)
        view.scatter(new_cnn)  # (L, B, k-1, D)
        return self.model.ctc_log_probs(ys)  # (B, T', V)
