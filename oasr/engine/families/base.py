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
    ChunkGeometry,
    FeatureSource,
)
from oasr.cache import CacheConfig, SlotStateCache, SlotStateView
from oasr.fmha import PagedKVCache

if TYPE_CHECKING:
    pass

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

    def prepare_for_serving(self) -> int:
        """Work the first chunk would otherwise do, done once the model has its serving dtype
        and device (and int8 layers, if any): the family's weight layouts for its fused
        kernels. Returns the weights prepared (0: nothing to do, the default)."""
        return 0

    @abstractmethod
    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        """Encode one chunk of every row, write K/V into the pool and the new state into
        ``batch.states`` (only once the forward succeeded).

        Returns:
            (B, T', V) CTC log-probabilities (float32), rows padded to the longest chunk.
        """
