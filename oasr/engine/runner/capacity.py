"""Whether a pool can serve its slots, and how much room is left for one more stream.

Two questions a deployment asks of the K/V pool, answered from the `CacheConfig` alone:

- at startup, `check_pool_covers_slots`: can every slot run at once without the pool running
  dry in the middle of a step, and can each stream hold a useful amount of audio? A pool that
  fails either would start and then end every stream early (``length`` after 0.64 s) or stop
  streams mid-step, so the engine refuses it with a message that says what to change;
- at run time, `blocks_for_one_stream`: the blocks a newly admitted stream may need to run to
  its ceiling; readiness (``/readyz``) compares the pool's free blocks with it.
"""

from __future__ import annotations

from oasr.cache import CacheConfig

# A stream must be able to hold at least this many chunks of history (1.28 s with 640 ms
# chunks): below it every stream ends "length" almost at once.
MIN_STREAM_BLOCKS = 2


def blocks_for_one_stream(config: CacheConfig) -> int:
    """Pool blocks one stream can hold at most: its retained window and the chunk in flight
    when history is evicted (``num_left_chunks >= 0``), else its ceiling."""
    return config.peak_blocks_per_stream


def check_pool_covers_slots(config: CacheConfig) -> None:
    """Refuse a pool whose streams could each hold almost nothing.

    With eviction, ``CacheConfig`` itself refuses a pool smaller than ``max_batch_size``
    windows (specification §10.2); with unlimited history a stream's ceiling is its share of
    the pool, and one under `MIN_STREAM_BLOCKS` blocks would end every stream "length" after
    its first chunk.

    Raises:
        ValueError: with the blocks each stream would get, and what to change.
    """
    if config.max_logical_blocks is None and config.blocks_per_stream < MIN_STREAM_BLOCKS:
        raise ValueError(
            f"each stream could hold only {config.blocks_per_stream} block "
            f"({config.max_stream_frames} encoder frames) of the {config.max_num_blocks}-block "
            f"pool shared by {config.max_batch_size} slots, so every stream would end 'length' "
            f"after its first chunk: raise --max-num-blocks to >= "
            f"{MIN_STREAM_BLOCKS * config.max_batch_size} or lower --max-batch-size to <= "
            f"{max(1, config.max_num_blocks // MIN_STREAM_BLOCKS)}")
