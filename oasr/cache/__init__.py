"""Per-stream cache state for chunked streaming inference: the shared K/V block pool, its
slot-addressed block tables, fixed-extent slot state (conv left context), pooled CTC decoder
state, and the per-stream ``StreamContext`` facade."""

from oasr.cache.attention_cache import AttentionCacheManager, StreamKVInfo
from oasr.cache.block_pool import BlockPool
from oasr.cache.state import StreamSlotPool
from oasr.cache.types import CacheConfig, default_device

__all__ = [
    "AttentionCacheManager",
    "BlockPool",
    "CacheConfig",
    "StreamKVInfo",
    "StreamSlotPool",
    "default_device",
]
