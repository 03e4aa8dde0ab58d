"""Prometheus metrics for ``GET /metrics``.

Pool, stream, eviction, refusal and finish-reason values are read from the engine's stats
snapshot at scrape time (a custom collector), so they can never drift from ``/api/stats``.
The step-time and real-time-factor histograms are sampled by the stats hub: once per stats
interval in which the engine ran at least one step, it observes the latest step's time and the
engine's recent real-time factor (``observe_snapshot``). Their ``_count`` is the number of
samples; ``oasr_engine_steps_total`` counts the steps themselves. The partials' lag histogram
(``oasr_partial_lag_seconds``: audio received and not decoded when each partial was sent) is
the engine's own, every partial counted, its buckets made cumulative here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from oasr.engine.snapshot import LAG_BUCKETS_S, EngineSnapshot, StreamsSnapshot

REJECTION_REASONS = ("origin", "max_connections", "not_ready", "draining")
STEP_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class _SnapshotCollector(Collector):
    """Turns one engine stats snapshot into metric families, at scrape time."""

    def __init__(self, stats: Callable[[], EngineSnapshot | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        if snapshot is None:
            return
        pool, streams = snapshot.pool, snapshot.streams
        blocks = GaugeMetricFamily(
            "oasr_pool_blocks", "K/V pool blocks by state", labels=["state"])
        blocks.add_metric(["used"], pool.num_used_blocks)
        blocks.add_metric(["free"], pool.num_free_blocks)
        yield blocks
        yield GaugeMetricFamily(
            "oasr_pool_capacity_blocks", "K/V pool size in blocks", value=pool.num_blocks)
        active = GaugeMetricFamily("oasr_streams", "Streams by state", labels=["state"])
        active.add_metric(["active"], streams.active)
        active.add_metric(["waiting"], streams.waiting)
        active.add_metric(["suspended"], streams.suspended)
        yield active
        yield GaugeMetricFamily(
            "oasr_streams_admissible", "Streams that may be admitted now: free slots, within "
            "the step's cost budget (admission by latency)", value=streams.num_admissible)
        lag = _lag_histogram(streams)
        if lag is not None:
            yield lag
        yield CounterMetricFamily(
            "oasr_evictions", "K/V blocks evicted from streams' history",
            value=snapshot.num_evictions)
        finished = CounterMetricFamily(
            "oasr_streams_finished", "Finished streams by finish reason", labels=["reason"])
        for reason, count in sorted(snapshot.finish_reasons.items()):
            finished.add_metric([reason], count)
        yield finished
        yield CounterMetricFamily(
            "oasr_streams_refused", "Streams refused busy after waiting for a slot",
            value=snapshot.num_refused)
        yield CounterMetricFamily(
            "oasr_engine_steps", "Engine steps that ran a batch", value=snapshot.step.num_steps)
        second = snapshot.second_pass
        if second.enabled:
            finals = CounterMetricFamily(
                "oasr_finals", "Segment finals by the pass whose text they carry",
                labels=["source"])
            finals.add_metric(["whisper"], second.num_second_pass_finals)
            finals.add_metric(["ctc"], second.num_first_pass_finals)
            yield finals
            yield GaugeMetricFamily(
                "oasr_second_pass_backlog", "Segments queued for the second pass",
                value=second.backlog)
            yield GaugeMetricFamily(
                "oasr_second_pass_decoders", "Second-pass decoding processes working side by side",
                value=second.num_decoders)
            rejected = CounterMetricFamily(
                "oasr_second_pass_rejected",
                "Whisper texts the guard against the first pass replaced by the CTC text",
                labels=["reason"])
            for reason, count in sorted(second.rejected.items()):
                rejected.add_metric([reason], count)
            yield rejected
            yield CounterMetricFamily(
                "oasr_second_pass_temperature_fallbacks",
                "Whisper decodes redone at a higher temperature",
                value=second.num_temperature_fallbacks)
            yield CounterMetricFamily(
                "oasr_second_pass_decodes_cancelled",
                "Finals whose Whisper beam search was given up because the segment was aborted "
                "(an early final the speaker went on from)",
                value=second.num_decodes_cancelled)
            yield CounterMetricFamily(
                "oasr_second_pass_context_retries",
                "Whisper decodes redone on their segment's audio alone because the decode "
                "after the previous segment's text ended at once",
                value=second.num_context_retries)
            yield CounterMetricFamily(
                "oasr_second_pass_beam_retries",
                "Greedy finals of a busy server that failed the fallback rule and were decoded "
                "again by the beam search",
                value=second.num_beam_retries)
            yield CounterMetricFamily(
                "oasr_second_pass_busy_seconds",
                "Seconds the second pass's decoding processes spent in decoder steps, all "
                "together", value=second.busy_s)
            yield CounterMetricFamily(
                "oasr_second_pass_holds",
                "Times the second pass waited because the streaming step was behind",
                value=second.num_holds)
            yield CounterMetricFamily(
                "oasr_second_pass_held_seconds",
                "Seconds the second pass waited because the streaming step was behind, all "
                "holds together", value=second.held_s)
            yield CounterMetricFamily(
                "oasr_second_pass_expired",
                "Finals that kept their CTC text because the second pass waited too long",
                value=second.num_expired)
            yield CounterMetricFamily(
                "oasr_second_pass_evicted",
                "Finals that kept their CTC text: a paced or less-served stream's final took "
                "their place in a full backlog",
                value=second.num_evicted)


def _lag_histogram(streams: StreamsSnapshot) -> HistogramMetricFamily | None:
    """The partials' lag as a Prometheus histogram (cumulative buckets, then +Inf); None when
    the snapshot has no lag counts."""
    if len(streams.lag_counts) != len(LAG_BUCKETS_S) + 1:
        return None
    buckets, total = [], 0
    for bound, count in zip((*LAG_BUCKETS_S, float("inf")), streams.lag_counts, strict=True):
        total += count
        buckets.append(("+Inf" if bound == float("inf") else f"{bound:g}", total))
    return HistogramMetricFamily(
        "oasr_partial_lag_seconds", "Audio received and not decoded yet when each partial was "
        "sent (how far behind the stream's text was)", buckets=buckets,
        sum_value=streams.lag_sum_s)


class ServerMetrics:
    """One registry per app (no process-global state): the engine's and the server's metrics.

    Every sample carries ``replica="<name>"`` so that Prometheus can sum replicas behind a
    load balancer (``sum by (...)``) and tell them apart.
    """

    def __init__(self, stats: Callable[[], EngineSnapshot | None], replica: str = "") -> None:
        self.replica = replica
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_SnapshotCollector(stats))
        self.rejected = Counter(
            "oasr_rejected_connections", "Websocket connections refused, by reason",
            ["reason"], registry=self.registry)
        self.connections = Gauge(
            "oasr_connections", "Open websocket connections by endpoint", ["endpoint"],
            registry=self.registry)
        self.step_seconds = Histogram(
            "oasr_step_seconds", "Engine step wall time, sampled once per stats interval",
            buckets=STEP_SECONDS_BUCKETS, registry=self.registry)
        self.rtf = Histogram(
            "oasr_rtf", "Real-time factor (compute s per audio s), sampled per stats interval "
            "while the engine steps", buckets=RTF_BUCKETS, registry=self.registry)
        for reason in REJECTION_REASONS:  # present at 0 from the start, for dashboards
            self.rejected.labels(reason=reason)
        self._num_steps = 0

    def observe_snapshot(self, snapshot: EngineSnapshot) -> None:
        """Sample the histograms if the engine stepped since the previous snapshot."""
        num_steps = snapshot.step.num_steps
        if num_steps > self._num_steps:
            self.step_seconds.observe(snapshot.step.last_ms / 1000.0)
            self.rtf.observe(snapshot.rtf)
        self._num_steps = num_steps

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (with the replica label)."""
        if not self.replica:
            return generate_latest(self.registry)
        return generate_latest(_Labelled(self.registry, {"replica": self.replica}))


class _Labelled:
    """A registry view whose every sample has ``labels`` added (what ``generate_latest``
    reads: an object with ``collect()``)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self._registry = registry
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [sample._replace(labels={**sample.labels, **self._labels})
                                for sample in family.samples]
            yield labelled
