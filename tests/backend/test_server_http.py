"""Health, stats, metrics, the stats websocket and the static page, on a real engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

import pytest
from server_helpers import frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from backend.app import create_app
from backend.prometheus import ServerMetrics
from backend.stats import StatsHub

pytestmark = pytest.mark.timeout(60)


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.text == "ready\n"


def test_readiness_is_false_before_startup_and_after_shutdown(
        make_config: Callable[..., object]) -> None:
    app = create_app(make_config())  # type: ignore[arg-type]
    assert TestClient(app).get("/readyz").status_code == 503  # no lifespan: no engine
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        engine = app.state.context.engine
    assert not engine.is_alive()  # the lifespan stopped the engine it started


def test_api_stats_snapshot(client: TestClient) -> None:
    snapshot = client.get("/api/stats").json()
    assert set(snapshot) == {  # the page's contract (tests/engine/test_snapshot.py: the rest)
        "pool", "streams", "num_evictions", "finish_reasons", "num_refused", "endpoints",
        "endpoints_between_chunks",
        "step", "second_pass", "rtf", "total_audio_s", "uptime_s", "model", "engine_alive",
        "time", "server"}
    pool = snapshot["pool"]
    assert pool["num_blocks"] == 16 and pool["num_free_blocks"] == 16
    assert pool["owners"] == [None] * 16
    assert snapshot["streams"]["max_batch_size"] == 2
    assert set(snapshot["finish_reasons"]) == {"stop", "length", "timeout", "abort", "error",
                                               "abandoned"}
    assert snapshot["server"] == {
        "connections": 0, "max_connections": 64, "realtime_connections": 0, "stats_viewers": 0,
        "replica": "", "draining": False, "drain_seconds_left": None, "queued_audio_s": 0.0,
        "num_flow_pauses": 0}
    assert snapshot["model"]["chunk_ms"] == 640


def test_stats_socket_pushes_owners_of_a_live_stream(client: TestClient) -> None:
    with client.websocket_connect("/ws/stats") as stats, \
            client.websocket_connect("/ws/asr") as asr:
        asr.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(1.5)):
            asr.send_bytes(frame)
        stream_id = asr.receive_json()["stream_id"]
        for _ in range(200):  # snapshots every 50 ms; the stream's first chunk is 640 ms
            snapshot = stats.receive_json()
            if stream_id in snapshot["pool"]["owners"]:
                break
        else:
            raise AssertionError("no snapshot showed the stream's blocks")
        assert snapshot["streams"]["active"] == 1
        assert snapshot["streams"]["list"][0]["stream_id"] == stream_id
        assert snapshot["server"]["connections"] == 1
        assert snapshot["server"]["stats_viewers"] == 1
        step = snapshot["step"]  # the panel's batch chart: one width per busy step so far
        assert step["recent_batch_sizes"] == [1] * min(step["num_steps"], 64) != []


def test_metrics_exposition(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(1.5)):
            ws.send_bytes(frame)
        ws.send_json({"type": "end"})
        while True:
            try:
                ws.receive_json()
            except WebSocketDisconnect:
                break

    def finished_and_sampled() -> bool:
        text = client.get("/metrics").text  # the hub samples step times every 50 ms
        return ('oasr_streams_finished_total{reason="stop"} 1.0' in text
                and "oasr_step_seconds_count 0.0" not in text)

    wait_until(finished_and_sampled, what="the finished stream and a step sample in /metrics")
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in ('oasr_pool_blocks{state="free"} 16.0', 'oasr_pool_blocks{state="used"} 0.0',
                 "oasr_pool_capacity_blocks 16.0", 'oasr_streams{state="active"} 0.0',
                 'oasr_streams{state="waiting"} 0.0', "oasr_evictions_total 0.0",
                 'oasr_streams_finished_total{reason="abort"} 0.0',
                 'oasr_rejected_connections_total{reason="origin"} 0.0'):
        assert line in text, line
    steps = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("oasr_engine_steps_total"))
    assert steps >= 2  # 1.5 s of audio is three 640 ms chunks
    samples = next(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("oasr_step_seconds_count"))
    assert 1 <= samples <= steps
    assert "oasr_rtf_bucket" in text


def test_the_page_and_its_modules_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'src="js/main.js"' in page.text
    for path in ("/js/main.js", "/js/capture-worklet.js", "/js/pool-panel.js", "/css/style.css"):
        response = client.get(path)
        assert response.status_code == 200, path
    assert "javascript" in client.get("/js/main.js").headers["content-type"]
    assert client.get("/nope.js").status_code == 404


def test_stats_socket_refuses_foreign_origins(make_client: Callable[..., TestClient]) -> None:
    client = make_client()
    with pytest.raises(WebSocketDisconnect) as refused, \
            client.websocket_connect("/ws/stats", headers={"origin": "https://evil.example"}):
        pass
    assert refused.value.code == 1008


def test_stats_hub_skips_a_snapshot_it_cannot_publish(client: TestClient,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    served = client.app.state.context.snapshot()  # type: ignore[attr-defined]
    stepped = replace(served.engine, step=replace(served.engine.step, num_steps=3, last_ms=12.0),
                      rtf=0.2)
    good = replace(served, engine=stepped)
    snapshots = iter([SimpleNamespace(), good])  # the first has no engine part: publishing fails
    metrics = ServerMetrics(lambda: None)
    hub = StatsHub(lambda: next(snapshots), metrics, interval_s=0.01)  # type: ignore[arg-type, return-value]

    async def run_briefly() -> object:
        queue = hub.subscribe()
        task = asyncio.create_task(hub.run())
        try:
            return await asyncio.wait_for(queue.get(), 5)
        finally:
            task.cancel()

    assert asyncio.run(run_briefly()) is good
    assert "could not be published" in caplog.text
    assert "oasr_step_seconds_count 1.0" in metrics.render().decode()


def test_second_pass_metrics_appear_when_it_is_on(client: TestClient) -> None:
    snapshot = client.get("/api/stats").json()
    assert not snapshot["second_pass"]["enabled"]
    assert "oasr_finals_total" not in client.get("/metrics").text
    assert set(snapshot["second_pass"]["rejected"]) == {"failed", "length", "distance"}
    engine = client.app.state.context.engine_stats()  # type: ignore[attr-defined]
    second = replace(engine.second_pass, enabled=True, backlog=2, num_decoders=2,
                     num_second_pass_finals=5,
                     num_first_pass_finals=1, num_temperature_fallbacks=3,
                     num_decodes_cancelled=4, num_context_retries=6, num_beam_retries=7,
                     held_s=2.5, rejected={**engine.second_pass.rejected, "distance": 1})
    text = ServerMetrics(lambda: replace(engine, second_pass=second)).render().decode()
    assert 'oasr_finals_total{source="whisper"} 5.0' in text
    assert 'oasr_finals_total{source="ctc"} 1.0' in text
    assert "oasr_second_pass_backlog 2.0" in text
    assert "oasr_second_pass_decoders 2.0" in text
    assert 'oasr_second_pass_rejected_total{reason="distance"} 1.0' in text
    assert 'oasr_second_pass_rejected_total{reason="length"} 0.0' in text
    assert "oasr_second_pass_temperature_fallbacks_total 3.0" in text
    assert "oasr_second_pass_decodes_cancelled_total 4.0" in text
    assert "oasr_second_pass_context_retries_total 6.0" in text
    assert "oasr_second_pass_beam_retries_total 7.0" in text
    assert "oasr_second_pass_held_seconds_total 2.5" in text
