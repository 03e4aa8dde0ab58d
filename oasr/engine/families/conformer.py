"""The Conformer-CTC family (WeNet-compatible `AsrModel`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from oasr.audio import (
    ChunkGeometry,
    FeatureSource,
    StreamingFbank,
)
from oasr.engine.families.base import ChunkBatch, FrameTiming, KVGeometry, ModelFamily
from oasr.models import AsrModel


class ConformerFamily(ModelFamily):
    """WeNet-compatible Conformer-CTC (`AsrModel`): fbank windows; the encoder declares its
    state (the per-layer conv cache, ``ConformerEncoder.streaming_state_specs``)."""

    name = "conformer_ctc"
    model: AsrModel
    # the CTC head (31 outputs: cheap, and it ranks the tokens), the position projection
    # (applied once to the sinusoid table and cached; the attention reads its weight) and the
    # conv2d stem's output Linear (the stem stays float: it reads its dtype off that layer)
    float_linears = ("ctc.ctc_lo", "linear_pos", "embed.out.0")
    offset_sized_positions = True  # the relative table has max_offset + T rows

    @property
    def streaming_encoder(self) -> Any:
        return self.model.encoder

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

    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        ys, _, _ = self.model.encoder.forward_chunk_paged(
            batch.feats, batch.feat_lens, batch.offsets, batch.caches,
            max_offset=batch.max_offset, states=batch.states)  # reads / scatters by name
        return self.model.ctc_log_probs(ys)  # (B, T', V)
