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
(`oasr.engine.families.zipformer`), keeps none (its model's ``streaming_kind = "slot"``): its
whole cache is declared slot state (the slot runtime). A family holds the model; it keeps no
stream state (the cache layer does).

Fixed-extent state is the model's to declare: the streaming encoder
(`ModelFamily.streaming_encoder`) lists its `StreamStateSpec`s (``streaming_state_specs``;
a slot-runtime model ``slot_state_specs``), its chunk forward reads and writes them by name
from the ``states`` views the family passes through, and `ModelFamily.build_states` makes
one `SlotStateCache` of whatever it declares. A persistent state is written at admission
from the encoder's ``stream_conditioning(stream_id)`` (`oasr.engine.runner.streams`). Adding
a state changes the model only: no family adapter, no engine code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from oasr.audio import (
    MODEL_SAMPLE_RATE,
    ChunkGeometry,
    FeatureSource,
)
from oasr.cache import CacheConfig, SlotStateCache, SlotStateView, StreamStateSpec
from oasr.fmha import PagedKVCache

if TYPE_CHECKING:
    pass

FEATURE_SHIFT_S = 0.01  # both families' feature frames: a 160-sample hop at 16 kHz
STREAMING_KINDS = ("paged", "slot")  # a model's ``streaming_kind``: which runtime serves it


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
        kind = self.streaming_kind
        if kind not in STREAMING_KINDS:
            raise ValueError(f"{type(self.streaming_encoder).__name__}.streaming_kind is "
                             f"{kind!r}; the engine runs {' or '.join(STREAMING_KINDS)}")

    @property
    def streaming_encoder(self) -> Any:
        """The module that declares the per-stream state and whose chunk forward reads it
        (the model itself unless a family says otherwise)."""
        return self.model

    @property
    def streaming_kind(self) -> str:
        """``"paged"`` (self-attention K/V in the shared block pool, plus declared
        fixed-extent state) or ``"slot"`` (every per-stream tensor is declared slot state: the
        slot runtime, no block pool): the encoder's ``streaming_kind``, else ``"paged"``."""
        return str(getattr(self.streaming_encoder, "streaming_kind", "paged"))

    @property
    def paged_kv(self) -> bool:
        """Whether the engine builds a K/V block pool for this family (``"paged"``)."""
        return self.streaming_kind == "paged"

    def state_specs(self) -> tuple[StreamStateSpec, ...]:
        """The encoder's declared fixed-extent state: ``slot_state_specs`` for the slot
        runtime, else ``streaming_state_specs`` (none when it declares nothing)."""
        encoder = self.streaming_encoder
        name = "slot_state_specs" if self.streaming_kind == "slot" else "streaming_state_specs"
        return tuple(getattr(encoder, name, ()))

    @property
    def conditions_streams(self) -> bool:
        """Whether the encoder gives each stream values for its persistent states
        (``stream_conditioning``)."""
        return callable(getattr(self.streaming_encoder, "stream_conditioning", None))

    def stream_conditioning(self, stream_id: int) -> Mapping[str, float]:
        """The values of the stream's persistent states (the encoder's
        ``stream_conditioning(stream_id)``), written into its slot at admission; none when
        the encoder gives none."""
        if not self.conditions_streams:
            return {}
        return dict(self.streaming_encoder.stream_conditioning(stream_id))

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

    def build_states(self, cache_config: CacheConfig, pad_lanes: int = 0) -> SlotStateCache:
        """The slot-addressed fixed-extent state of every stream (zeroed slots): one tensor per
        declared spec (`state_specs`), ``max_batch_size`` slots plus ``pad_lanes`` rows that
        padded steps address instead of a stream's."""
        return SlotStateCache(self.state_specs(), cache_config.max_batch_size,
                              cache_config.device, cache_config.dtype, pad_lanes)

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
        """Encode one chunk of every row, write K/V into the pool and scatter the new state
        into ``batch.states`` (the runner's views stage it: it becomes the streams' only when
        the whole chunk succeeded). ``batch.states`` goes to the encoder as it is: the encoder
        reads its declared states by name.

        Returns:
            (B, T', V) CTC log-probabilities (float32), rows padded to the longest chunk.
        """
