"""Per-stream cache state for chunked streaming inference: the shared K/V block pool, its
slot-addressed block tables, fixed-extent slot state (conv left context), per-stream CTC
decoder state, and the specification's reference API (``StreamContext``, dense mode, WeNet
layout; ``oasr.cache.reference``). The layer stores state and computes nothing; of oasr it
imports only ``oasr.fmha``, the layer below it."""

from oasr.cache.attention_cache import AttentionCacheManager, StreamKVInfo
from oasr.cache.block_pool import BlockPool
from oasr.cache.cnn_cache import CnnCacheManager
from oasr.cache.ctc_state import (
    CtcStateCacheManager,
    DecoderFactory,
    StreamHandle,
    StreamingDecoder,
)
from oasr.cache.reference.context import StreamContext
from oasr.cache.slot_state import HeldState, SlotStateCache, SlotStateView, StateView
from oasr.cache.slots import StreamSlotPool
from oasr.cache.state_spec import StreamStateSpec
from oasr.cache.types import CacheConfig, default_device

__all__ = [
    "AttentionCacheManager",
    "BlockPool",
    "CacheConfig",
    "CnnCacheManager",
    "CtcStateCacheManager",
    "DecoderFactory",
    "HeldState",
    "SlotStateCache",
    "SlotStateView",
    "StateView",
    "StreamContext",
    "StreamHandle",
    "StreamKVInfo",
    "StreamSlotPool",
    "StreamStateSpec",
    "StreamingDecoder",
    "default_device",
]
