"""/metrics for issue #50: the partials' lag histogram, suspended streams, admissible streams."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient

pytestmark = pytest.mark.timeout(60)


def metrics(client: TestClient) -> dict[str, Any]:
    """Every sample of /metrics: {name: {label tuple: value}}."""
    families = text_string_to_metric_families(client.get("/metrics").text)
    out: dict[str, Any] = {}
    for family in families:
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def stream_and_end(client: TestClient, seconds: float) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(seconds)):
            ws.send_bytes(frame)
        ws.send_json({"type": "end"})
        while ws.receive_json()["type"] != "done":
            pass


def test_the_partial_lag_histogram_is_the_engines_cumulated(client: TestClient) -> None:
    stream_and_end(client, 3.0)
    # the snapshot that counts the stream's last partials, once the engine is idle (stable)
    wait_until(lambda: (streams := client.get("/api/stats").json()["streams"])["active"] == 0
               and sum(streams["lag"]["counts"]) > 0, what="the partials' lag counted")
    stats = client.get("/api/stats").json()["streams"]["lag"]
    samples = metrics(client)
    buckets = samples["oasr_partial_lag_seconds_bucket"]
    bounds = [*(f"{b:g}" for b in stats["buckets_s"]), "+Inf"]
    cumulative = [buckets[(("le", le),)] for le in bounds]
    expected = [float(sum(stats["counts"][:i + 1])) for i in range(len(bounds))]
    assert cumulative == expected
    assert samples["oasr_partial_lag_seconds_count"][()] == sum(stats["counts"])
    assert samples["oasr_partial_lag_seconds_sum"][()] == pytest.approx(stats["sum_s"], abs=1e-3)


def test_suspended_and_admissible_streams_are_gauges(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.receive_json()
        ws.close(4000)  # a drop: the stream is suspended
    wait_until(lambda: metrics(client)["oasr_streams"][(("state", "suspended"),)] == 1,
               what="a suspended stream in /metrics")
    samples = metrics(client)
    assert samples["oasr_streams"][(("state", "active"),)] == 1  # it keeps its slot
    admissible = client.get("/api/stats").json()["streams"]["admissible"]
    assert samples["oasr_streams_admissible"][()] == admissible == 1  # 2 slots, 1 held
