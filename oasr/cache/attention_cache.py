"""Per-stream paged attention K/V: logical blocks, slot-addressed block tables, eviction.

Policy over the pool's mechanism: this manager decides how many blocks a stream holds, which
stream owns which block, and when the oldest block of a stream is evicted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from oasr.cache.block_pool import BlockPool
from oasr.cache.block_table import BlockTables
from oasr.cache.reference.dense_mode import DenseModeMixin
from oasr.cache.slots import SlotBindings, padded_slot_list, slots_to_device
from oasr.cache.stream_kv import StreamKVInfo, StreamKVState
from oasr.cache.types import CacheConfig
from oasr.fmha import GatherWorkspace, PagedKVCache


class AttentionCacheManager(DenseModeMixin):
    """Maps each stream's logical K/V blocks onto the shared ``BlockPool``.

    Storage: one persistent ``block_table`` (max_batch_size + pad_lanes, max_blocks_per_seq)
    int32 and one ``cache_seqlens`` (max_batch_size + pad_lanes,) int32 on the config's device;
    a stream owns the row of its slot. Both are edited on a host mirror and flushed to the device
    in one copy before any device read (see ``HostMirroredTable``), so no Python scalar is ever
    written through an index into a device tensor.

    Invariants, per stream: frame p of the block-table row is in ``logical_blocks[p // bs]`` at
    slot ``p % bs``; ``block_table[slot, :len(logical_blocks)] == logical_blocks`` and zeros
    after; the history is row frames ``start .. start + num_committed_frames - 1``, with
    ``cache_starts[slot] == start < bs`` and ``cache_seqlens[slot] == start +
    num_committed_frames``. With eviction on (history bounded to the last chunks), a commit of a full chunk
    leaves exactly the last ``chunk_size * num_left_chunks`` frames: the oldest frames are
    evicted one by one (FIFO), a block freed (a left shift of the row) once all its frames
    are. The history then begins ``start`` frames into its first block, a multiple of
    ``gcd(chunk_size, block_size)``, at most ``bs - gcd``; after a short chunk (a stream's
    last, in the engine) a start past that loses the rest of its block (fewer than ``gcd``
    frames), which bounds a stream's blocks by ``CacheConfig.peak_blocks_per_stream``. Pad
    lanes (rows past ``max_batch_size``) point only
    at a scratch block, at the cache length every stream starts with; no stream is ever bound
    to them.

    The stream's slot is the caller's (the engine's ``StreamSlotPool``); this manager only
    binds it. Dense mode (``commit``, ``get_stacked_cache``), the specification's reference API,
    comes from ``oasr.cache.reference.dense_mode``.
    """

    def __init__(self, pool: BlockPool, config: CacheConfig, pad_lanes: int = 0) -> None:
        if not isinstance(pad_lanes, int) or pad_lanes < 0:
            raise ValueError(f"pad_lanes must be an int >= 0, got {pad_lanes!r}")
        expected = (config.num_layers, config.block_size_frames, config.n_kv_head, config.head_dim)
        actual = (pool.config.num_layers, *pool.block_shape)
        if expected != actual or pool.num_blocks != config.max_num_blocks:
            raise ValueError(
                f"pool geometry (layers, block, heads, dim)={actual}, {pool.num_blocks} blocks "
                f"does not match the config's {expected}, {config.max_num_blocks} blocks"
            )
        self.pool = pool
        self.config = config
        self.pad_lanes = pad_lanes
        self.num_rows = config.max_batch_size + pad_lanes
        self._bindings = SlotBindings(config.max_batch_size)
        self.num_evictions = 0
        self._bs = config.block_size_frames
        self._streams: dict[int, StreamKVState] = {}
        self._block_limit = config.peak_blocks_per_stream
        self._window = config.history_frames  # frames kept after a commit; None: all
        self._grid = math.gcd(config.chunk_size, config.block_size_frames)  # where history starts
        # whether a row's history can begin inside its first block (then attention masks it)
        self._starts_inside = self._window is not None and self._grid < self._bs
        self._tables = BlockTables(config, pad_lanes, pool.scratch_block_ids, config.prefill_frames)
        # the step's gathered K/V on CPU, reused by every layer and step (see GatherWorkspace)
        self.gather_workspace = GatherWorkspace()

    # ---------------------------------------------------------------- stream lifecycle

    @property
    def pad_lane_slots(self) -> tuple[int, ...]:
        """Rows past ``max_batch_size`` that pad a batch; they write only into scratch."""
        return self._tables.pad_lane_slots

    @property
    def stream_ids(self) -> list[int]:
        return list(self._streams)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def allocate_stream(self, stream_id: int, slot: int | None = None) -> int:
        """Register a stream and bind it to a row; prefill its zeroed window if configured.

        Args:
            stream_id: any int not currently allocated here.
            slot: the stream's slot, from the caller's ``StreamSlotPool`` (the engine's), or
                None to bind the lowest slot no stream here holds (a manager used alone).
        Returns:
            The stream's slot.
        Raises:
            ValueError: duplicate stream id, or a slot that is out of range or bound.
            RuntimeError: no slot given and none unbound, or the pool cannot hold the
                prefilled window.
        """
        slot = self._bindings.bind(stream_id, slot)
        state = StreamKVState(slot=slot)
        try:
            self._init_row(state)
        except RuntimeError:
            self._bindings.unbind(stream_id)
            raise
        self._streams[stream_id] = state
        return slot

    def free_stream(self, stream_id: int) -> None:
        """Free every block of the stream, blank its row and unbind its slot."""
        state = self._get_state(stream_id)
        self._release_blocks(state)
        self._tables.set_seqlen(state.slot, 0)
        del self._streams[stream_id]
        self._bindings.unbind(stream_id)

    def reset_stream(self, stream_id: int) -> None:
        """Start the stream's history over in place (an endpoint): free its blocks, blank its
        row, re-prefill the zeroed window if configured; the slot is kept."""
        state = self._get_state(stream_id)
        self._release_blocks(state)
        state.num_committed_frames = 0
        state.num_total_frames = 0
        state.prepared = False
        self._init_row(state)

    def _init_row(self, state: StreamKVState) -> None:
        """An empty history, or the prefilled window: ``prefill_frames`` zeroed frames."""
        frames = self.config.prefill_frames
        ids = self.pool.allocate(math.ceil(frames / self._bs))
        self.pool.zero_blocks(ids)
        self._append_blocks(state, ids)
        state.num_committed_frames = frames
        self._set_row_length(state)

    def _set_row_length(self, state: StreamKVState) -> None:
        self._tables.set_seqlen(state.slot, state.start + state.num_committed_frames)
        self._tables.set_start(state.slot, state.start)

    def _release_blocks(self, state: StreamKVState) -> None:
        self.pool.free(state.logical_blocks)
        state.logical_blocks = []
        state.start = 0
        self._tables.clear(state.slot)
        self._tables.set_start(state.slot, 0)

    def _get_state(self, stream_id: int) -> StreamKVState:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise KeyError(f"stream {stream_id} is not allocated in the attention cache") from None

    def slot_of(self, stream_id: int) -> int:
        return self._get_state(stream_id).slot

    # ---------------------------------------------------------------- block bookkeeping

    def _num_new_blocks(self, state: StreamKVState, num_frames: int) -> int:
        needed = math.ceil((state.start + state.num_committed_frames + num_frames) / self._bs)
        return max(0, needed - len(state.logical_blocks))

    def _check_capacity(self, stream_id: int, state: StreamKVState, num_frames: int) -> int:
        new = self._num_new_blocks(state, num_frames)
        if len(state.logical_blocks) + new > self._block_limit:
            raise RuntimeError(
                f"stream {stream_id} is at capacity: it holds {len(state.logical_blocks)} blocks "
                f"({state.num_committed_frames} frames) and a chunk of {num_frames} frames would "
                f"need block {len(state.logical_blocks) + new} of at most {self._block_limit} "
                f"(max_stream_frames={self.config.max_stream_frames}); check at_capacity() first"
            )
        return new

    def _append_blocks(self, state: StreamKVState, block_ids: Sequence[int]) -> None:
        self._tables.write(state.slot, len(state.logical_blocks), block_ids)
        state.logical_blocks.extend(block_ids)

    def _commit_frames(self, state: StreamKVState, num_frames: int) -> None:
        state.num_committed_frames += num_frames
        state.num_total_frames += num_frames
        window = self._window
        if window is not None and state.num_committed_frames > window:
            self._evict_frames(state, state.num_committed_frames - window)
        self._release_unused(state)
        self._set_row_length(state)

    def _release_unused(self, state: StreamKVState) -> None:
        """Give back blocks prepared for frames a short chunk did not write (a chunk of
        several blocks can leave whole ones unused), so a commit leaves no empty block."""
        used = math.ceil((state.start + state.num_committed_frames) / self._bs)
        unused = len(state.logical_blocks) - used
        if unused > 0:
            self.pool.free(state.logical_blocks[used:])
            state.logical_blocks = state.logical_blocks[:used]
            self._tables.truncate(state.slot, used, unused)

    def _evict_frames(self, state: StreamKVState, n: int) -> None:
        """Drop the ``n`` oldest frames of the history and free every block left without a
        frame of history (a left shift of the row). A history that would begin further into
        its first block than full chunks ever leave it (``block - gcd(chunk, block)``: only
        after a short chunk) loses the rest of that block too, fewer than
        ``gcd(chunk, block)`` frames."""
        start = state.start + n
        held = state.num_committed_frames - n
        within = start % self._bs
        if held > 0 and within > self._bs - self._grid:
            extra = min(self._bs - within, held)
            start, held = start + extra, held - extra
        freed = len(state.logical_blocks) if held == 0 else start // self._bs
        state.start = 0 if held == 0 else start - freed * self._bs
        state.num_committed_frames = held
        if freed:
            evicted = state.logical_blocks[:freed]
            state.logical_blocks = state.logical_blocks[freed:]
            self.pool.free(evicted)
            self._tables.shift_left(state.slot, freed, len(state.logical_blocks))
            state.num_evictions += freed
            self.num_evictions += freed

    # ---------------------------------------------------------------- paged mode

    def at_capacity(self, stream_id: int) -> bool:
        """True when the stream cannot take another full chunk (unlimited history only: with
        eviction a stream's history is bounded and it never reaches a ceiling)."""
        state = self._get_state(stream_id)
        new = self._num_new_blocks(state, self.config.chunk_size)
        return len(state.logical_blocks) + new > self._block_limit

    def prepare_chunk(self, stream_id: int) -> None:
        """Make sure blocks exist for the stream's next ``chunk_size`` frames (at most one new).

        Raises:
            KeyError: unknown stream. RuntimeError: stream at capacity, or pool exhausted.
        """
        self.prepare_chunks_batched([stream_id])

    def prepare_chunks_batched(self, stream_ids: Sequence[int]) -> None:
        """``prepare_chunk`` for several streams with ONE pool allocation, handed out in order.

        All checks run before anything is allocated, so a failure changes nothing.

        Raises:
            ValueError: a stream id repeated. KeyError: unknown stream.
            RuntimeError: a stream at capacity, or the pool cannot cover the cohort.
        """
        if len(set(stream_ids)) != len(stream_ids):
            raise ValueError(f"stream ids repeat in the batch: {list(stream_ids)}")
        states = [self._get_state(sid) for sid in stream_ids]
        chunk = self.config.chunk_size
        needs = [self._check_capacity(sid, st, chunk) for sid, st in zip(stream_ids, states, strict=True)]
        block_ids = self.pool.allocate(sum(needs))
        start = 0
        for state, need in zip(states, needs, strict=True):
            self._append_blocks(state, block_ids[start : start + need])
            start += need
            state.prepared = True

    def commit_chunk_paged(self, stream_id: int, chunk_frames: int) -> None:
        """Account ``chunk_frames`` frames the model wrote into the prepared blocks, then evict.

        Args:
            chunk_frames: frames actually written, 0..chunk_size (a stream's last chunk may be
                short).
        Raises:
            ValueError: ``chunk_frames`` outside 0..chunk_size.
            RuntimeError: more frames than the prepared blocks hold (prepare_chunk missing).
        """
        state = self._get_state(stream_id)
        if not 0 <= chunk_frames <= self.config.chunk_size:
            raise ValueError(f"chunk_frames must be in 0..{self.config.chunk_size}, got {chunk_frames}")
        room = len(state.logical_blocks) * self._bs - state.start - state.num_committed_frames
        if chunk_frames > room:
            raise RuntimeError(
                f"stream {stream_id}: committing {chunk_frames} frames but its blocks have room for "
                f"{room}; call prepare_chunk before the forward"
            )
        self._commit_frames(state, chunk_frames)

    def get_paged_state_views(self, stream_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream's rows: block_table (1, max_blocks_per_seq) and cache_seqlens (1,), int32.

        Views of the persistent tensors (they follow later commits).
        Raises:
            RuntimeError: prepare_chunk never called since allocation or the last reset.
        """
        state = self._get_state(stream_id)
        if not state.prepared:
            raise RuntimeError(
                f"stream {stream_id} has no prepared chunk: call prepare_chunk before reading its "
                "paged caches"
            )
        return self._tables.row_views(state.slot)

    def get_paged_caches(self, stream_id: int) -> list[PagedKVCache]:
        """One ``PagedKVCache`` per layer for this stream alone (B = 1)."""
        block_table, cache_seqlens = self.get_paged_state_views(stream_id)
        state = self._streams[stream_id]
        slot = torch.tensor([state.slot], device=self.config.device)
        return self._layer_caches(block_table, cache_seqlens,
                                  state.start + state.num_committed_frames, slot)

    def get_batched_paged_caches(
        self, stream_ids: Sequence[int], pad_to: int | None = None
    ) -> list[PagedKVCache]:
        """One ``PagedKVCache`` per layer for a batch, rows gathered by one slots tensor.

        Args:
            stream_ids: B distinct prepared streams, in batch order.
            pad_to: append pad-lane rows up to this batch size (needs ``pad_lanes >= 1``).
        Returns:
            Caches whose block_table is (B', max_blocks_per_seq) and cache_seqlens (B',), with
            ``host_seqlen`` the largest held history (host ints, no device sync).
        """
        for sid in stream_ids:
            if not self._get_state(sid).prepared:
                raise RuntimeError(f"stream {sid} has no prepared chunk: call prepare_chunk first")
        slots = self.batch_slots(stream_ids, pad_to)
        block_table, cache_seqlens = self._tables.gather(slots)  # (B, max_blocks), (B,)
        spans = [self._row_frames(self._streams[sid]) for sid in stream_ids]
        if pad_to is not None and pad_to > len(stream_ids):
            spans.append(self.config.prefill_frames)
        return self._layer_caches(block_table, cache_seqlens, max(spans, default=0), slots)

    def paged_caches_for_slots(self, slots: torch.Tensor, host_seqlen: int) -> list[PagedKVCache]:
        """One ``PagedKVCache`` per layer for rows given as a device slots tensor (a captured
        step's static input: the gather reads the tables at replay time).

        Args:
            slots: (B,) int64 rows: stream slots and pad lanes, prepared by the caller.
            host_seqlen: an upper bound of the frames the rows span (sizes the gather).
        """
        block_table, cache_seqlens = self._tables.gather(slots)  # (B, max_blocks), (B,)
        return self._layer_caches(block_table, cache_seqlens, host_seqlen, slots)

    def flush_tables(self) -> None:
        """Bring the device block table and cache lengths up to date (before a replay, which
        reads them without running the host code that would flush)."""
        self._tables.flush()

    def _layer_caches(
        self, block_table: torch.Tensor, cache_seqlens: torch.Tensor, host_seqlen: int,
        slots: torch.Tensor,
    ) -> list[PagedKVCache]:
        """The layers' caches over the rows ``slots``; their history starts go along only
        where a history can begin inside its first block (else every start is 0)."""
        starts = self._tables.gather_starts(slots) if self._starts_inside else None  # (B,)
        views = [self.pool.get_kv_view(layer) for layer in range(self.config.num_layers)]
        return [
            PagedKVCache(k_cache=k, v_cache=v, block_table=block_table, cache_seqlens=cache_seqlens,
                         block_size=self._bs, host_seqlen=host_seqlen, cache_starts=starts,
                         workspace=self.gather_workspace)
            for k, v in views
        ]

    @staticmethod
    def _row_frames(state: StreamKVState) -> int:
        """Frames the stream's row spans: its history and the evicted frames before it."""
        return state.start + state.num_committed_frames

    def batch_slots(self, stream_ids: Sequence[int], pad_to: int | None = None) -> torch.Tensor:
        """(B',) int64 device rows of a batch: the streams' slots, then pad lanes up to ``pad_to``."""
        return slots_to_device(self.batch_slot_list(stream_ids, pad_to), self.config.device)

    def batch_slot_list(self, stream_ids: Sequence[int], pad_to: int | None = None) -> list[int]:
        """Host list of the rows ``batch_slots`` returns."""
        slots = [self._get_state(sid).slot for sid in stream_ids]
        return padded_slot_list(slots, pad_to, self.pad_lane_slots)

    def cached_frames(self, stream_ids: Sequence[int]) -> torch.Tensor:
        """(B,) int32 frames each stream's row spans (its cache_seqlens rows: the history,
        and with eviction by frame the evicted frames before it in its first block; the key
        positions of a chunk are counted back from it), on the device."""
        return self._tables.gather(self.batch_slots(stream_ids))[1]

    def max_cached_frames(self, stream_ids: Sequence[int]) -> int:
        """Host int: the most frames any of the prepared streams' rows spans (a gather's size).

        Raises:
            RuntimeError: a stream with no prepared chunk (its row would address no block).
        """
        span = 0
        for sid in stream_ids:
            state = self._get_state(sid)
            if not state.prepared:
                raise RuntimeError(f"stream {sid} has no prepared chunk: call prepare_chunk first")
            span = max(span, self._row_frames(state))
        return span

    def num_cached_frames(self, stream_id: int) -> int:
        """Host int: frames of history the stream holds (no device read)."""
        return self._get_state(stream_id).num_committed_frames

    @property
    def block_table(self) -> torch.Tensor:
        """(max_batch_size + pad_lanes, max_blocks_per_seq) int32 device table, up to date."""
        return self._tables.block_table

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """(max_batch_size + pad_lanes,) int32 device cache lengths, up to date."""
        return self._tables.cache_seqlens

    @property
    def cache_starts(self) -> torch.Tensor:
        """(max_batch_size + pad_lanes,) int32 device history starts, up to date."""
        return self._tables.cache_starts

    def host_block_table_row(self, stream_id: int) -> list[int]:
        """The stream's block-table row as the device will hold it (host ints, no device read)."""
        return self._tables.host_row(self._get_state(stream_id).slot)

    # ---------------------------------------------------------------- stats

    def stream_info(self, stream_id: int) -> StreamKVInfo:
        state = self._get_state(stream_id)
        return StreamKVInfo(
            stream_id=stream_id,
            slot=state.slot,
            block_ids=tuple(state.logical_blocks),
            num_cached_frames=state.num_committed_frames,
            num_total_frames=state.num_total_frames,
            num_evictions=state.num_evictions,
        )

    def block_owner_snapshot(self) -> list[int | None]:
        """For every physical block id, the stream that owns it, or None (free or scratch)."""
        owners: list[int | None] = [None] * self.pool.num_physical_blocks
        for sid, state in self._streams.items():
            for block_id in state.logical_blocks:
                owners[block_id] = sid
        return owners
