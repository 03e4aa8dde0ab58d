"""Model families: what the engine needs from an encoder, one adapter per family.

The engine serves two streaming CTC encoder families through one interface, `ModelFamily`:

| | Conformer-CTC (WeNet) | Whisper-CTC |
|---|---|---|
| features | Kaldi fbank (`StreamingFbank`) | causal log-mel (`CausalLogMel`) |
| chunk windows | 67 frames every 64 (the conv2d stem's context) | 2 * chunk plain frames |
| encoder frame | 40 ms (4x subsampling) | 20 ms (2x) |
| fixed-extent state | per-layer depthwise-conv cache (`CnnCacheManager`) | conv-stem tails (2 specs) |
| positions | relative, unlimited | absolute, ``max_positions`` (1500 = 30 s) |

Both keep their self-attention K/V in the same paged pool. A third family, icefall's Zipformer
(`oasr.engine.families.zipformer`), keeps none (``paged_kv = False``): its whole cache is
declared slot state (the slot runtime). A family holds the model; it keeps no stream state
(the cache layer does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from oasr.audio import (
    MODEL_SAMPLE_RATE,
    BufferedFeatures,
    ChunkGeometry,
    FeatureSource,
    StreamingFbank,
)
from oasr.cache import CacheConfig, CnnCacheManager, SlotStateCache, SlotStateView
from oasr.cache.cnn_cache import CNN_STATE
from oasr.fmha import PagedKVCache
from oasr.models import AsrModel

if TYPE_CHECKING:
    from oasr.models.whisper_ctc.model import WhisperCtcModel

FEATURE_SHIFT_S = 0.01  # both families' feature frames: a 160-sample hop at 16 kHz


@dataclass(frozen=True)
class KVGeometry:
    """The attention-cache geometry a family asks of `CacheConfig`.

    Attributes:
        num_layers: encoder layers (one K/V plane each).
        n_kv_head: key/value heads; head_dim: per-head dimension.
        hidden_dim, kernel_size: the Conformer's depthwise-conv cache (width and kernel);
            a family without one names its conv stem's width and kernel (unused by the pool).
    """

    num_layers: int
    n_kv_head: int
    head_dim: int
    hidden_dim: int
    kernel_size: int


@dataclass(frozen=True)
class FrameTiming:
    """How encoder frames map onto time and samples.

    Attributes:
        frame_shift_s: seconds per encoder frame (0.04 Conformer, 0.02 Whisper-CTC).
        right_context_samples: samples past a frame's own span that the encoder reads (what a
            segment's audio must include beyond its last frame).
    """

    frame_shift_s: float
    right_context_samples: int

    @property
    def samples_per_frame(self) -> int:
        """16 kHz samples per encoder frame (640 Conformer, 320 Whisper-CTC)."""
        return round(self.frame_shift_s * MODEL_SAMPLE_RATE)


@dataclass(frozen=True)
class ChunkBatch:
    """One cohort's encoder input, in batch-row order.

    Attributes:
        feats: (B, T, F) feature windows, rows zero-padded past ``feat_lens``.
        feat_lens: (B,) int64 feature frames per row.
        offsets: (B,) int64 encoder frames each stream produced since its last reset.
        max_offset: host ``max(offsets)`` (sizes position tables without a device sync).
        caches: one PagedKVCache per layer, rows prepared for this chunk.
        states: the family's fixed-extent state, one gather/scatter view per declared spec.
    """

    feats: Tensor
    feat_lens: Tensor
    offsets: Tensor
    max_offset: int
    caches: list[PagedKVCache]
    states: dict[str, SlotStateView]


class ModelFamily(ABC):
    """The engine's view of one loaded model: features, chunking, cache geometry, state
    specs, the batched paged chunk forward, frame timing and the position limit."""

    name: str = ""
    # False: the family's whole per-stream cache is declared slot state (the slot runtime,
    # `oasr.engine.families.zipformer`); the engine builds no block pool for it
    paged_kv: bool = True
    # what forward_chunk returns and which decoder reads it: "ctc" (log-probs, the CTC decoder)
    # or "transducer" (joiner-projected encoder frames, `oasr.engine.runner.transducer`)
    decoding: str = "ctc"
    # Linear layers (qualified-name suffixes) `quantize_int8` keeps in float
    float_linears: tuple[str, ...] = ()
    # the chunk forward's position table grows with ``ChunkBatch.max_offset`` (so a padded
    # step rounds the offset up, `oasr.engine.runner.padding`); otherwise it only guards a fixed table
    offset_sized_positions: bool = False

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    @abstractmethod
    def timing(self) -> FrameTiming: ...

    @property
    @abstractmethod
    def default_chunk_size(self) -> int:
        """Encoder frames per chunk the model was trained for (640 ms for both families)."""

    @property
    @abstractmethod
    def max_positions(self) -> int | None:
        """Encoder frames a stream may reach before it must be reset; None: no limit."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def tokenizer(self) -> Any: ...

    @abstractmethod
    def kv_geometry(self) -> KVGeometry: ...

    @abstractmethod
    def chunk_geometry(self, chunk_size: int) -> ChunkGeometry:
        """How ``chunk_size`` encoder frames map onto feature frames."""

    @abstractmethod
    def new_features(self) -> FeatureSource:
        """A fresh feature extractor for one stream."""

    @abstractmethod
    def build_states(self, cache_config: CacheConfig, pad_lanes: int = 0) -> SlotStateCache:
        """The slot-addressed fixed-extent state of every stream (zeroed slots), plus
        ``pad_lanes`` rows that padded steps write instead of a stream's."""

    def quantize_int8(self) -> list[str]:
        """Swap the model's Linear layers for `Int8Linear` in place, except ``float_linears``.

        Returns:
            The qualified names of the layers now in int8.
        """
        from oasr.models.int8 import quantize_linears

        keep = self.float_linears
        return quantize_linears(self.model, skip=lambda name, _: any(
            name == k or name.endswith("." + k) for k in keep))

    @abstractmethod
    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        """Encode one chunk of every row, write K/V into the pool and the new state into
        ``batch.states`` (only once the forward succeeded).

        Returns:
            (B, T', V) CTC log-probabilities (float32), rows padded to the longest chunk.
        """


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
        from oasr.models.whisper_ctc.frontend import CausalLogMel

        return BufferedFeatures(CausalLogMel(self.model.config.n_mels), self.model.config.n_mels)

    def build_states(self, cache_config: CacheConfig, pad_lanes: int = 0) -> SlotStateCache:
        from oasr.models.whisper_ctc.streaming import whisper_ctc_state_specs

        return SlotStateCache(whisper_ctc_state_specs(self.model.config),
                              cache_config.max_batch_size, cache_config.device, cache_config.dtype,
                              pad_lanes)

    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        from oasr.models.whisper_ctc.streaming import CONV1_STATE, CONV2_STATE, forward_chunk_paged

        conv1, conv2 = batch.states[CONV1_STATE], batch.states[CONV2_STATE]
        out = forward_chunk_paged(self.model, batch.feats, batch.feat_lens, batch.offsets,
                                  batch.caches, conv1.gather(), conv2.gather(), batch.max_offset)
        conv1.scatter(out.conv1_state)  # (B, 2, n_mels)
        conv2.scatter(out.conv2_state)  # (B, 2, width)
        return out.log_probs


def family_for(model: nn.Module) -> ModelFamily:
    """The family adapter of a loaded model.

    Raises:
        TypeError: a model of no known family.
    """
    if isinstance(model, AsrModel):
        return ConformerFamily(model)
    from oasr.models.whisper_ctc.model import WhisperCtcModel

    if isinstance(model, WhisperCtcModel):
        return WhisperCtcFamily(model)
    from oasr.models.zipformer.model import ZipformerModel

    if isinstance(model, ZipformerModel):
        from oasr.engine.families.zipformer import ZipformerFamily

        return ZipformerFamily(model)
    raise TypeError(
        f"no model family serves {type(model).__name__}: expected an AsrModel (Conformer-CTC), "
        "a WhisperCtcModel or a ZipformerModel"
    )

