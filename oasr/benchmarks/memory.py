"""K/V bytes per stream (from the formula, checked against the allocator) and the proof that
a steady-state engine step allocates no new tensors for caches.

Steady state: with ``num_left_chunks`` >= 0 every stream holds a bounded window after
``num_left_chunks + 1`` chunks. From then on a step must reuse the preallocated pool, block
tables, cache lengths and conv-state buffer in place: same storage, same number of used blocks,
and no tensor surviving the step that did not exist before it.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from oasr.benchmarks.drivers import EngineDriver, bench_engine_config
from oasr.benchmarks.workload import BenchModel, load_speech
from oasr.cache import BlockPool
from oasr.engine.runner.memory import bytes_per_kv_block, cache_config_for
from oasr.engine.runner.streams import StreamResources

HISTORY_SECONDS = 60.0  # the unlimited-history figure: a minute, or the model's position limit


@dataclass(frozen=True)
class KvBytes:
    """Exact K/V sizes for the benchmark model's geometry.

    Attributes:
        dtype: element type of the pool.
        bytes_per_frame: 2 (K and V) * layers * heads * head_dim * element size.
        bytes_per_block: ``bytes_per_kv_block`` (frames per block * bytes_per_frame).
        allocator_bytes_per_block: a real BlockPool's K + V bytes / its blocks (must match).
        bytes_per_stream_left: the most a stream holds with ``num_left_chunks`` (retained
            window plus the in-flight block).
        num_left_chunks: the window used for ``bytes_per_stream_left``.
        history_seconds: the unlimited-history span of ``bytes_per_stream_history``: 60 s, or
            less when the model's positions end sooner (Whisper-CTC: 1500 x 20 ms = 30 s).
        bytes_per_stream_history: ``history_seconds`` of unlimited history, in whole blocks.
        dense_new_cache_bytes_per_chunk: bytes of the fresh att_cache tensor the dense path
            allocates every chunk at that window (WeNet's concatenation).
    """

    dtype: str
    bytes_per_frame: int
    bytes_per_block: int
    allocator_bytes_per_block: int
    bytes_per_stream_left: int
    num_left_chunks: int
    history_seconds: float
    bytes_per_stream_history: int
    dense_new_cache_bytes_per_chunk: int


def kv_bytes(bench: BenchModel, num_left_chunks: int = 4, device: str = "auto") -> KvBytes:
    """The formula's numbers, and one real pool allocation to check them against."""
    config = bench_engine_config(2, 4, num_left_chunks, device=device)
    dev = config.resolve_device()
    cache = cache_config_for(config, bench.family.kv_geometry(), dev,
                             config.resolve_dtype(dev, bench.family_name), bench.chunk_size)
    element = torch.empty((), dtype=cache.dtype).element_size()
    per_frame = 2 * cache.num_layers * cache.n_kv_head * cache.head_dim * element
    per_block = bytes_per_kv_block(cache)
    pool = BlockPool(cache)
    measured = pool.nbytes // pool.num_physical_blocks
    held_blocks = cache.peak_blocks_per_stream if cache.has_eviction else 1
    window_frames = cache.chunk_size * (num_left_chunks + 1)
    history_frames = round(HISTORY_SECONDS / bench.frame_seconds)
    if bench.family.max_positions is not None:
        history_frames = min(history_frames, bench.family.max_positions)
    history_blocks = math.ceil(history_frames / cache.block_size_frames)
    return KvBytes(str(cache.dtype).replace("torch.", ""), per_frame, per_block, measured,
                   held_blocks * per_block, num_left_chunks,
                   round(history_frames * bench.frame_seconds, 2), history_blocks * per_block,
                   window_frames * per_frame)


@dataclass(frozen=True)
class TensorCensus:
    """Live tensors reachable from Python: how many, and their storages as (address, bytes)."""

    num_tensors: int
    storages: frozenset[tuple[int, int]]

    @staticmethod
    def take() -> TensorCensus:
        gc.collect()
        storages = set()
        count = 0
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor):  # type(): no lazy-attribute warnings
                count += 1
                if obj.is_mkldnn:  # oneDNN's packed weights: opaque, no storage to read
                    storages.add((id(obj), obj.numel() * obj.element_size()))
                    continue
                storage = obj.untyped_storage()
                storages.add((storage.data_ptr(), storage.nbytes()))
        return TensorCensus(count, frozenset(storages))


@dataclass(frozen=True)
class SteadyStateCheck:
    """What ``steps`` steady-state engine steps did to the cache memory.

    Attributes:
        num_streams, num_left_chunks: the run's geometry.
        steps: steady-state steps checked (after the warm-up that fills every window).
        same_storage: every cache tensor (K pool, V pool, block table, cache lengths, the
            family's fixed-extent state: conv cache / conv-stem tails) kept its storage
            address and shape.
        used_blocks: pool blocks in use after each checked step.
        live_tensor_delta: live tensors after minus before.
        new_storages: tensor storages alive after the steps that were not before, other than
            the CTC decoder states' own buffers (temporaries freed within a step never count).
        new_storage_bytes: their bytes.
        decoder_state_new_bytes: bytes of CTC decoder-state storages that are new after the
            steps. The streams' states are rows of the decoder's one persistent storage, so
            this is 0 unless its token buffers doubled (a hypothesis outgrew them) or it
            gained rows. Reported apart: it is the decoding layer's, not the K/V or conv
            caches'.
        device_bytes_delta: CUDA allocated bytes after minus before (None on CPU).
    """

    num_streams: int
    num_left_chunks: int
    steps: int
    same_storage: bool
    used_blocks: tuple[int, ...]
    live_tensor_delta: int
    new_storages: int
    new_storage_bytes: int
    decoder_state_new_bytes: int
    device_bytes_delta: int | None

    @property
    def allocates_no_cache_tensors(self) -> bool:
        """The K/V and conv caches: pool, block tables, cache lengths and conv state reused in
        place, the pool's use constant, and no other tensor kept (decoder states aside)."""
        device_kept = (self.device_bytes_delta or 0) - self.decoder_state_new_bytes
        return (self.same_storage and len(set(self.used_blocks)) == 1
                and self.new_storages == 0 and device_kept <= 0)


def _cache_tensors(resources: StreamResources) -> list[tuple[int, tuple[int, ...]]]:
    pool, attention = resources.pool, resources.attention
    paged = [] if pool is None or attention is None else [
        *(t for layer in range(pool.config.num_layers) for t in pool.get_kv_view(layer)),
        attention.block_table, attention.cache_seqlens]
    tensors = [*paged, *resources.states.buffers.values()]
    return [(t.data_ptr(), tuple(t.shape)) for t in tensors]


def _decoder_storages(resources: StreamResources, stream_ids: list[int]) -> set[tuple[int, int]]:
    storages = set()
    for stream_id in stream_ids:
        state = resources.ctc.get_state(stream_id)
        for f in dataclasses.fields(state):
            value = getattr(state, f.name)
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                storages.add((storage.data_ptr(), storage.nbytes()))
    return storages


def check_steady_state(bench: BenchModel, audio_dir: Path, num_streams: int,
                       num_left_chunks: int = 4, steps: int = 3,
                       device: str = "auto") -> SteadyStateCheck:
    """Run the engine past its warm-up, then watch ``steps`` more steps."""
    warmup = num_left_chunks + 3
    speech = load_speech(audio_dir, num_streams, bench.chunk_seconds * (warmup + steps + 2))
    config = bench_engine_config(num_streams, warmup + steps + 1, num_left_chunks, device=device)
    driver = EngineDriver(bench, speech, config)
    resources = driver.resources
    driver.run(warmup)
    before_tensors = _cache_tensors(resources)
    streams = list(range(num_streams))
    decoder_before = _decoder_storages(resources, streams)
    census = TensorCensus.take()
    cuda = resources.runner.device.type == "cuda"
    allocated = torch.cuda.memory_allocated() if cuda else 0
    used = []
    for _ in range(steps):
        driver.step()
        pool = resources.pool
        used.append(0 if pool is None else pool.num_blocks - pool.num_free_blocks)
    after = TensorCensus.take()
    device_delta = torch.cuda.memory_allocated() - allocated if cuda else None
    decoder_after = _decoder_storages(resources, streams)
    new = after.storages - census.storages - decoder_after
    regrown = decoder_after - decoder_before
    return SteadyStateCheck(
        num_streams, num_left_chunks, steps, _cache_tensors(resources) == before_tensors,
        tuple(used), after.num_tensors - census.num_tensors, len(new),
        sum(n for _, n in new), sum(n for _, n in regrown), device_delta)
