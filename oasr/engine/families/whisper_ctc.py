"""The Whisper-CTC family: a Whisper encoder fine-tuned as a chunk-causal streaming CTC encoder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from oasr.audio import (
    BufferedFeatures,
    ChunkGeometry,
    FeatureSource,
)
from oasr.engine.families.base import ChunkBatch, FrameTiming, KVGeometry, ModelFamily

if TYPE_CHECKING:
    from oasr.models.whisper_ctc.frontend import LogMelSpectra
    from oasr.models.whisper_ctc.model import WhisperCtcModel


class WhisperCtcFamily(ModelFamily):
    """Whisper-encoder CTC (`WhisperCtcModel`): causal log-mel, plain chunks of 2 * chunk
    frames, conv-stem tails as declared state, absolute positions up to ``max_positions``."""

    name = "whisper_ctc"
    model: WhisperCtcModel
    float_linears = ("ctc",)  # the CTC head: 384 x 31, 0.2% of the FLOPs, ranks the tokens

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        from oasr.models.bundled import BUNDLED_UNITS
        from oasr.text.tokenizer import CharTokenizer

        self._tokenizer = CharTokenizer(list(getattr(self.model, "units", BUNDLED_UNITS)))
        self._spectra: LogMelSpectra | None = None  # the streams' own, made with the first

    @property
    def timing(self) -> FrameTiming:
        # encoder frame j reads log-mel frames 2j, 2j + 1; frame i ends at sample 160 i + 200
        return FrameTiming(frame_shift_s=self.model.config.frame_shift_s, right_context_samples=40)

    @property
    def default_chunk_size(self) -> int:
        return int(self.model.config.chunk_frames)

    @property
    def max_positions(self) -> int | None:
        return int(self.model.config.max_positions)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def kv_geometry(self) -> KVGeometry:
        cfg = self.model.config
        return KVGeometry(num_layers=cfg.layers, n_kv_head=cfg.heads,
                          head_dim=cfg.head_dim, hidden_dim=cfg.width, kernel_size=3)

    def chunk_geometry(self, chunk_size: int) -> ChunkGeometry:
        # 2 frames per encoder frame, no overlap: right_context 1 makes the window 2 * chunk
        return ChunkGeometry(chunk_size=chunk_size, subsampling=self.model.config.subsampling,
                             right_context=1)

    def new_features(self) -> FeatureSource:
        """A stream's causal log-mel; every stream shares the family's window and filterbank,
        so one step's streams are computed in one call (`CausalLogMel.accept_many`)."""
        from oasr.models.whisper_ctc.frontend import CausalLogMel, LogMelSpectra

        n_mels = self.model.config.n_mels
        if self._spectra is None:
            self._spectra = LogMelSpectra(n_mels)
        return BufferedFeatures(CausalLogMel(n_mels, self._spectra), n_mels)

    def prepare_for_serving(self) -> int:
        """Pack the chunk step's fused bfloat16 weights now (`streaming.prepack`), so the first
        live chunk does not reorder them (~9 ms at 64 streams); none in float32 or on CUDA."""
        from oasr.models.whisper_ctc.streaming import prepack

        return prepack(self.model)

    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        from oasr.models.whisper_ctc.streaming import forward_chunk_states

        out = forward_chunk_states(self.model, batch.feats, batch.feat_lens, batch.offsets,
                                   batch.caches, batch.states, batch.max_offset)  # by name
        return out.log_probs
