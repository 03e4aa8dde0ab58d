"""Readiness by capacity, liveness of the engine loop, engine death, drain refusals, bounded
JSON and the replica label, in-process (TestClient) on a real engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from server_helpers import engine_held, frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from backend.prometheus import ServerMetrics

pytestmark = pytest.mark.timeout(60)


def collect(ws: Any) -> tuple[list[dict[str, Any]], int]:
    messages = []
    while True:
        try:
            messages.append(ws.receive_json())
        except WebSocketDisconnect as exc:
            return messages, exc.code


def test_readyz_turns_503_when_no_slot_is_free_and_200_again(client: TestClient) -> None:
    assert client.get("/readyz").status_code == 200
    with client.websocket_connect("/ws/asr") as first, \
            client.websocket_connect("/ws/asr") as second:
        for ws in (first, second):
            ws.send_json({"type": "start"})
            ws.send_bytes(frames(synthetic_pcm(0.2))[0])
            assert ws.receive_json()["type"] == "ready"
        wait_until(lambda: client.get("/readyz").status_code == 503, what="readyz 503")
        assert "0 free stream slots" in client.get("/readyz").text
        assert client.get("/healthz").status_code == 200  # full is healthy, just not ready
        for ws in (first, second):
            ws.send_json({"type": "end"})
            assert collect(ws)[0][-1]["type"] == "done"
    wait_until(lambda: client.get("/readyz").status_code == 200, what="readyz 200 again")


def test_readyz_headroom_counts_free_blocks(make_client: Callable[..., TestClient]) -> None:
    # 2 slots x 8 blocks: a headroom of 2 streams needs every slot and all 16 blocks free
    client = make_client(ready_headroom_streams=2)
    assert client.get("/readyz").status_code == 200
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(1.0)):
            ws.send_bytes(frame)
        assert ws.receive_json()["type"] == "ready"
        wait_until(lambda: client.get("/readyz").status_code == 503, what="readyz 503")
        ws.send_json({"type": "end"})
        collect(ws)
    wait_until(lambda: client.get("/readyz").status_code == 200, what="readyz 200 again")


def test_healthz_turns_503_while_the_engine_loop_is_stuck(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(stuck_after_s=0.3)
    with engine_held(client):
        wait_until(lambda: client.get("/healthz").status_code == 503, what="healthz 503")
        assert "stuck" in client.get("/healthz").text
    wait_until(lambda: client.get("/healthz").status_code == 200, what="healthz 200 again")


def test_engine_death_tells_every_client_and_fails_the_probes(client: TestClient) -> None:
    engine = client.app.state.context.engine  # type: ignore[attr-defined]
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_bytes(frames(synthetic_pcm(0.2))[0])
        assert ws.receive_json()["type"] == "ready"

        def broken_step() -> bool:
            raise RuntimeError("injected engine fault")

        engine.engine.step = broken_step
        ws.send_bytes(frames(synthetic_pcm(0.2))[0])  # wakes the loop
        messages, code = collect(ws)
    errors = [m for m in messages if m["type"] == "error"]
    assert errors and errors[0]["code"] == "internal" and "injected" in errors[0]["message"]
    assert messages[-1] == {"type": "done", "finish_reason": "error", "segments": 0}
    assert code == 1011
    assert client.get("/healthz").status_code == 503
    assert client.get("/readyz").status_code == 503
    with client.websocket_connect("/ws/asr") as late:  # refused at once, never left waiting
        messages, code = collect(late)
    assert messages[-1]["code"] == "busy" and code == 1013


def test_draining_refuses_new_sessions_and_fails_readiness(client: TestClient) -> None:
    context = client.app.state.context  # type: ignore[attr-defined]
    assert context.drain.begin()
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "draining" in ready.text
    assert client.get("/healthz").status_code == 200
    with client.websocket_connect("/ws/asr") as ws:
        messages, code = collect(ws)
    assert [m["code"] for m in messages] == ["draining"] and code == 1013
    assert client.get("/api/stats").json()["server"]["draining"] is True
    with client.websocket_connect("/ws/stats") as viewer:  # the panel still works
        assert viewer.receive_json()["server"]["draining"] is True


def test_deeply_nested_json_is_refused_before_parsing(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_text("[" * 2000 + "]" * 2000)  # 4,000 bytes: under the size limit
        messages, code = collect(ws)
    assert messages[-1]["code"] == "bad_request" and "deeper than 8" in messages[-1]["message"]
    assert code == 1008
    with client.websocket_connect("/ws/asr") as ws:  # brackets inside strings do not count
        ws.send_json({"type": "start", "format": "[[[[[[[[[[["})
        messages, code = collect(ws)
    assert messages[-1]["code"] == "unsupported", messages


def test_ready_message_names_the_replica(make_client: Callable[..., TestClient]) -> None:
    client = make_client(replica="oasr-7")
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_bytes(frames(synthetic_pcm(0.2))[0])
        assert ws.receive_json()["replica"] == "oasr-7"
        ws.send_json({"type": "end"})
        collect(ws)
    assert client.get("/api/stats").json()["server"]["replica"] == "oasr-7"
    assert 'oasr_pool_blocks{replica="oasr-7",state="free"} 16.0' in client.get("/metrics").text


def test_every_metric_sample_carries_the_replica_label() -> None:
    metrics = ServerMetrics(lambda: None, "r1")
    metrics.rejected.labels(reason="origin").inc()
    samples = [line for line in metrics.render().decode().splitlines()
               if line and not line.startswith("#")]
    assert samples and all('replica="r1"' in line for line in samples), samples
    assert 'oasr_rejected_connections_total{reason="origin",replica="r1"} 1.0' in samples
