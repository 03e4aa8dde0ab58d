"""EngineSnapshot: read by field in Python, served as the JSON the page has always read.

The key lists below were recorded from the stats JSON before the snapshot became a dataclass
(the page's JS and tests/e2e read these names); any change to them is a change of the page's
contract and must be made on purpose, here and in ``frontend/`` together.
"""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np
from engine_helpers import Collector

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.admission import DecoderLoad
from oasr.engine.commands import AppendAudio, OpenStream
from oasr.engine.snapshot import EngineSnapshot, PoolSnapshot

RECORDED_KEYS = {
    "endpoints", "endpoints_between_chunks", "finish_reasons", "finish_reasons.abort", "finish_reasons.error",
    "finish_reasons.length", "finish_reasons.stop", "finish_reasons.timeout",
    "finish_reasons.abandoned",
    "model", "model.chunk_ms", "model.device", "model.family", "model.name",
    "model.num_left_chunks", "num_evictions", "num_refused",
    "pool", "pool.block_size_frames", "pool.kind", "pool.num_blocks", "pool.num_free_blocks",
    "pool.num_slots", "pool.num_used_blocks", "pool.num_used_slots", "pool.owners",
    "pool.slot_owners", "rtf",
    "second_pass", "second_pass.avg_latency_ms", "second_pass.backlog", "second_pass.enabled",
    "second_pass.finals_by_source", "second_pass.finals_by_source.combined",
    "second_pass.finals_by_source.ctc", "second_pass.finals_by_source.whisper",
    "second_pass.num_backlog_full", "second_pass.num_combined",
    "second_pass.num_with_context", "second_pass.num_early_finals",
    "second_pass.num_early_discarded", "second_pass.held", "second_pass.num_holds",
    "second_pass.held_s",
    "second_pass.num_expired", "second_pass.num_evicted", "second_pass.num_decoders", "second_pass.num_decodes_cancelled",
    "second_pass.num_context_retries", "second_pass.num_beam_retries", "second_pass.busy_s",
    "second_pass.num_first_pass_finals", "second_pass.num_no_speech",
    "second_pass.num_no_voice", "second_pass.num_rejected", "second_pass.num_second_pass_finals",
    "second_pass.num_temperature_fallbacks", "second_pass.refine", "second_pass.rejected",
    "second_pass.rejected.distance", "second_pass.rejected.failed",
    "second_pass.rejected.length",
    "step", "step.avg_ms", "step.last_batch_size", "step.last_ms", "step.num_steps",
    "step.recent_batch_sizes",
    "streams", "streams.active", "streams.list", "streams.list[].audio_s",
    "streams.list[].lag_s", "streams.list[].num_blocks", "streams.list[].segment",
    "streams.list[].slot", "streams.list[].stream_id", "streams.max_batch_size",
    "streams.waiting", "streams.suspended", "streams.admissible", "streams.cost_per_audio_s",
    "streams.cost_per_step_s",
    "streams.lag", "streams.lag.buckets_s", "streams.lag.counts", "streams.lag.sum_s",
    "total_audio_s", "uptime_s",
}
REFINE_KEYS = {"second_pass.num_refined_streams", "second_pass.num_refinements",
               "second_pass.num_refining", "second_pass.refine_interval_s"}
SLOTS_POOL_KEYS = {"kind", "num_blocks", "num_used_blocks", "num_free_blocks",
                   "block_size_frames", "owners", "num_slots", "num_used_slots", "slot_owners",
                   "state_bytes"}


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key of a JSON value as a dotted path; list items as ``name[]``."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            out |= {path} | key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            out |= key_paths(item, prefix + "[]")
    return out


def _engine_with_a_running_stream(config: EngineConfig) -> ASREngine:
    engine = ASREngine(config)
    engine.submit(OpenStream(1, Collector().sink(1)))
    noise = np.random.default_rng(0).standard_normal(32000).astype(np.float32) * 0.1
    engine.submit(AppendAudio(1, noise))
    for _ in range(5):
        engine.step()
    engine.stats.refresh(engine.requests, engine.scheduler)
    return engine


def test_the_json_keys_are_the_recorded_ones(engine_config: EngineConfig) -> None:
    engine = _engine_with_a_running_stream(engine_config)
    snapshot = engine.latest_stats()
    assert isinstance(snapshot, EngineSnapshot)
    assert snapshot.streams.entries  # the stream's entry is in the list
    assert key_paths(snapshot.to_json()) == RECORDED_KEYS
    served = snapshot.stamped(engine_alive=True, time=1.0).to_json()
    assert key_paths(served) == RECORDED_KEYS | {"engine_alive", "time"}


def _fake_worker() -> types.SimpleNamespace:
    """A second pass with refinement, attributes only (no Whisper needed)."""
    return types.SimpleNamespace(
        backlog=0, num_temperature_fallbacks=0, num_rejected=0, num_combined=0,
        num_with_context=0,
        rejected={"failed": 0, "length": 0, "distance": 0}, num_no_voice=0, num_no_speech=0,
        num_refinements=3, held=False, num_holds=0, num_expired=0, num_evicted=0, num_decoders=2,
        num_cancelled=0, num_context_retries=0, num_beam_retries=0,
        busy_seconds=0.0, held_seconds=0.0)


def test_the_decoders_busy_time_is_measured_per_running_stream(engine_config: EngineConfig) -> None:
    engine = _engine_with_a_running_stream(engine_config)
    clock = [100.0]
    engine.stats.clock = lambda: clock[0]
    worker = _fake_worker()
    engine.live.finals.worker = worker  # type: ignore[assignment]
    assert engine.stats.recent_decoders(clock[0]) is None  # nothing recorded yet
    for second in range(31):  # a busy step a second, the decoders busy half of each
        engine.stats.record_step(0.01, 1, 0.64, engine.requests, engine.scheduler)
        clock[0] += 1.0
        worker.busy_seconds += 0.5 if second < 30 else 0.0
    load = engine.stats.recent_decoders(clock[0])
    # the steps of the last 20 s: busy 5.5 s -> 15 s over 19 s, one stream running
    assert load == DecoderLoad(busy_s=9.5, window_s=19.0, num_decoders=2, avg_streams=1.0)
    engine.stats.refresh(engine.requests, engine.scheduler)
    assert engine.latest_stats().second_pass.busy_s == 15.0
    engine.live.finals.worker = None  # type: ignore[assignment]
    assert engine.stats.recent_decoders(clock[0]) is None


def test_refinement_adds_its_counts_beside_the_flag(engine_config: EngineConfig) -> None:
    engine = _engine_with_a_running_stream(engine_config)
    assert engine.latest_stats().to_json()["second_pass"]["refine"] is False
    worker = _fake_worker()
    engine.live.finals.worker = worker  # type: ignore[assignment]
    engine.live.refiner = types.SimpleNamespace(worker=worker, avg_interval_s=1.234)  # type: ignore[assignment]
    engine.stats.refresh(engine.requests, engine.scheduler)
    snapshot = engine.latest_stats()
    assert snapshot.second_pass.enabled and snapshot.second_pass.refine is not None
    assert snapshot.second_pass.refine.num_refinements == 3
    json = snapshot.to_json()
    assert key_paths(json) == RECORDED_KEYS | REFINE_KEYS
    assert json["second_pass"]["refine"] is True
    assert json["second_pass"]["refine_interval_s"] == 1.23
    assert json["second_pass"]["num_decoders"] == 2


def test_a_slot_runtime_pool_sends_its_state_bytes() -> None:
    pool = PoolSnapshot(kind="slots", num_blocks=0, num_used_blocks=0, num_free_blocks=0,
                        block_size_frames=0, owners=(), num_slots=2, num_used_slots=1,
                        slot_owners=(7, None), state_bytes=4096)
    assert set(pool.to_json()) == SLOTS_POOL_KEYS
    assert pool.to_json()["slot_owners"] == [7, None]


def test_fields_read_what_the_json_says(engine_config: EngineConfig) -> None:
    engine = _engine_with_a_running_stream(engine_config)
    snapshot = engine.latest_stats()
    json = snapshot.to_json()
    entry = snapshot.streams.entry(1)
    assert entry is not None and json["streams"]["list"] == [{
        "stream_id": 1, "slot": entry.slot, "num_blocks": entry.num_blocks,
        "audio_s": entry.audio_s, "lag_s": entry.lag_s, "segment": entry.segment}]
    assert entry.audio_s == 2.0 and math.isclose(entry.decoded_s, 2.0 - entry.lag_s)
    assert snapshot.streams.entry(99) is None
    assert snapshot.streams.num_free_slots == engine_config.max_batch_size - 1
    assert json["pool"]["owners"] == list(snapshot.pool.owners)
    assert json["pool"]["num_used_blocks"] == snapshot.pool.num_used_blocks == entry.num_blocks
