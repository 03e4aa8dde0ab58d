"""EngineSnapshot: what the engine publishes about itself, as typed frozen records.

The snapshot travels engine -> backend -> page: the backend reads it by field (metrics,
readiness, stream lag) and serves ``to_json()`` at ``/api/stats`` and ``/ws/stats``. The JSON
is the page's contract (``frontend/``): its keys are pinned by tests/engine/test_snapshot.py.
Counts and ids only, never anyone's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

# upper bounds of the partial-lag histogram's buckets, seconds (`StreamsSnapshot.lag_counts`)
LAG_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class PoolSnapshot:
    """The paged K/V pool (``kind="paged"``), or for a slot-runtime family the slots alone
    (``kind="slots"``: block counts 0, ``state_bytes`` the slot state's size).

    ``owners[b]`` is physical block b's stream id or None; ``slot_owners[i]`` slot i's.
    """

    kind: Literal["paged", "slots"]
    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    block_size_frames: int
    owners: tuple[int | None, ...]
    num_slots: int
    num_used_slots: int
    slot_owners: tuple[int | None, ...]
    state_bytes: int | None = None  # slots only

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["owners"], out["slot_owners"] = list(self.owners), list(self.slot_owners)
        if self.state_bytes is None:
            del out["state_bytes"]
        return out


@dataclass(frozen=True)
class StreamEntry:
    """One running stream: its slot, blocks held, audio received and not yet decoded."""

    stream_id: int
    slot: int | None
    num_blocks: int
    audio_s: float
    lag_s: float
    segment: int

    @property
    def decoded_s(self) -> float:
        """Seconds of the stream's audio decoded so far."""
        return max(0.0, self.audio_s - self.lag_s)


@dataclass(frozen=True)
class StreamsSnapshot:
    """Streams running (``entries``, one each) and waiting for one of ``max_batch_size``
    slots."""

    active: int
    waiting: int
    max_batch_size: int
    entries: tuple[StreamEntry, ...]
    suspended: int = 0  # running streams whose client is away (`SuspendStream`)
    # streams that may be admitted now: free slots, within the step's cost budget
    # (`oasr.engine.admission`); None: slots alone decide
    admissible: int | None = None
    # the engine seconds a busy step costs: per second of the audio it decodes, and fixed
    # whatever it decodes (`oasr.engine.admission.StepCostModel`)
    cost_per_audio_s: float | None = None
    cost_per_step_s: float | None = None
    # partials' lag (audio received and not decoded): counts per bucket of
    # `LAG_BUCKETS_S` (the last: above every bucket), and their sum in seconds
    lag_counts: tuple[int, ...] = ()
    lag_sum_s: float = 0.0

    def entry(self, stream_id: int) -> StreamEntry | None:
        """The running stream's entry; None when it is not running."""
        return next((e for e in self.entries if e.stream_id == stream_id), None)

    @property
    def num_free_slots(self) -> int:
        """Slots neither running nor promised to a waiting stream."""
        return self.max_batch_size - self.active - self.waiting

    @property
    def num_admissible(self) -> int:
        """Streams that may be admitted now: the free slots, and within the step's cost."""
        if self.admissible is None:
            return self.num_free_slots
        return max(0, min(self.num_free_slots, self.admissible - self.waiting))

    def to_json(self) -> dict[str, Any]:
        return {"active": self.active, "waiting": self.waiting,
                "max_batch_size": self.max_batch_size, "suspended": self.suspended,
                "admissible": self.num_admissible,
                "cost_per_audio_s": (None if self.cost_per_audio_s is None
                                     else round(self.cost_per_audio_s, 4)),
                "cost_per_step_s": (None if self.cost_per_step_s is None
                                    else round(self.cost_per_step_s, 4)),
                "lag": {"buckets_s": list(LAG_BUCKETS_S), "counts": list(self.lag_counts),
                        "sum_s": round(self.lag_sum_s, 3)},
                "list": [asdict(entry) for entry in self.entries]}


@dataclass(frozen=True)
class StepSnapshot:
    """Busy steps: the last one's time and width, their running mean, the recent widths."""

    last_ms: float
    avg_ms: float
    last_batch_size: int
    num_steps: int
    recent_batch_sizes: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "recent_batch_sizes": list(self.recent_batch_sizes)}


@dataclass(frozen=True)
class RefineSnapshot:
    """Refined partials (present when refinement is on)."""

    num_refining: int
    num_refined_streams: int
    num_refinements: int
    refine_interval_s: float


@dataclass(frozen=True)
class SecondPassSnapshot:
    """The second pass: finals by the pass whose text they carry, the guard's rejections."""

    enabled: bool
    backlog: int
    num_second_pass_finals: int
    num_first_pass_finals: int
    num_backlog_full: int
    num_temperature_fallbacks: int
    num_rejected: int
    num_combined: int
    num_with_context: int  # finals decoded after the previous segment (final_context_s)
    num_early_finals: int  # finals decoded at a pause, before their endpoint (early_final_s)
    num_early_discarded: int  # such decodes dropped: the speaker went on
    finals_by_source: Mapping[str, int]
    rejected: Mapping[str, int]
    num_no_voice: int  # segments too quiet to decode
    num_no_speech: int  # segments decoded, but no speech
    avg_latency_ms: float
    held: bool = False  # waiting now: the streaming step is behind (second_pass_yield_s)
    num_holds: int = 0  # times it was made to wait
    held_s: float = 0.0  # seconds it waited so, all holds together
    num_expired: int = 0  # finals given up while it waited (they keep their CTC text)
    # finals whose place in a full backlog a paced or less-served stream's final took (they
    # keep their CTC text)
    num_evicted: int = 0
    num_decoders: int = 1  # decoding processes working side by side (second_pass_processes)
    num_decodes_cancelled: int = 0  # finals' beam searches given up: the job was aborted
    # decodes redone on their segment's audio alone: Whisper ended right after the context
    num_context_retries: int = 0
    # a busy server's greedy finals that failed the fallback rule and were beam-searched
    num_beam_retries: int = 0
    # seconds its decoding processes spent in decoder steps, all of them together
    busy_s: float = 0.0
    refine: RefineSnapshot | None = None

    def to_json(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "refine"}
        out["finals_by_source"] = dict(self.finals_by_source)
        out["rejected"] = dict(self.rejected)
        out["refine"] = self.refine is not None
        if self.refine is not None:  # flattened beside the flag, as the page reads them
            out.update(asdict(self.refine))
        return out


@dataclass(frozen=True)
class ModelSnapshot:
    """What is served: the model (its directory, or the bundled one), family and geometry."""

    name: str
    family: str
    chunk_ms: int
    device: str
    num_left_chunks: int


@dataclass(frozen=True)
class EngineSnapshot:
    """One consistent picture of the engine, built on its thread and replaced as a whole.

    ``engine_alive`` and ``time`` are stamped by `EngineThread.stats` (None: not sent).
    """

    pool: PoolSnapshot
    streams: StreamsSnapshot
    num_evictions: int
    finish_reasons: Mapping[str, int]
    num_refused: int
    endpoints: Mapping[str, int]
    step: StepSnapshot
    second_pass: SecondPassSnapshot
    rtf: float
    total_audio_s: float
    uptime_s: float
    model: ModelSnapshot
    num_quiet_endpoints: int = 0  # endpoints decided between chunks (of ``endpoints``)
    engine_alive: bool | None = None
    time: float | None = None

    def stamped(self, engine_alive: bool, time: float) -> EngineSnapshot:
        """This snapshot as the engine thread hands it out: with liveness and wall time."""
        return replace(self, engine_alive=engine_alive, time=time)

    def to_json(self) -> dict[str, Any]:
        """The JSON the stats API serves (every value a number, string, bool, list or dict)."""
        out: dict[str, Any] = {
            "pool": self.pool.to_json(),
            "streams": self.streams.to_json(),
            "num_evictions": self.num_evictions,
            "finish_reasons": dict(self.finish_reasons),
            "num_refused": self.num_refused,
            "endpoints": dict(self.endpoints),
            "endpoints_between_chunks": self.num_quiet_endpoints,
            "step": self.step.to_json(),
            "second_pass": self.second_pass.to_json(),
            "rtf": self.rtf,
            "total_audio_s": self.total_audio_s,
            "uptime_s": self.uptime_s,
            "model": asdict(self.model),
        }
        if self.engine_alive is not None:
            out["engine_alive"] = self.engine_alive
        if self.time is not None:
            out["time"] = self.time
        return out
