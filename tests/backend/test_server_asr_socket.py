"""/ws/asr through Starlette's TestClient against a real engine thread and a tiny model."""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import engine_held, frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient, WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from oasr.decoding import EndpointConfig, EndpointRule

pytestmark = pytest.mark.timeout(60)


def collect(ws: WebSocketTestSession) -> tuple[list[dict[str, Any]], int]:
    """Every JSON message until the server closes; returns (messages, close code)."""
    messages = []
    while True:
        try:
            messages.append(ws.receive_json())
        except WebSocketDisconnect as exc:
            return messages, exc.code


def stats(client: TestClient) -> dict[str, Any]:
    response = client.get("/api/stats")
    assert response.status_code == 200
    return response.json()


def pool_is_full(client: TestClient) -> bool:
    pool = stats(client)["pool"]
    return pool["num_used_blocks"] == 0 and pool["num_free_blocks"] == pool["num_blocks"]


def stream_file(ws: WebSocketTestSession, pcm: bytes, start: dict[str, Any] | None) -> None:
    if start is not None:
        ws.send_json(start)
    for frame in frames(pcm):
        ws.send_bytes(frame)
    ws.send_json({"type": "end"})


def assert_refused(ws: WebSocketTestSession, code: str, close_code: int) -> str:
    messages, closed_with = collect(ws)
    errors = [m for m in messages if m["type"] == "error"]
    assert errors and errors[-1]["code"] == code, messages
    assert closed_with == close_code
    assert errors[-1]["message"]
    return errors[-1]["message"]


def test_happy_path_ready_events_done_and_normal_close(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, synthetic_pcm(2.0), {"type": "start", "sample_rate": 16000,
                                             "format": "s16le"})
        messages, code = collect(ws)
    assert code == 1000
    ready, done = messages[0], messages[-1]
    assert ready["type"] == "ready" and isinstance(ready["stream_id"], int)
    assert ready["sample_rate"] == 16000 and ready["chunk_ms"] == 640
    assert done == {"type": "done", "finish_reason": "stop",
                    "segments": sum(m["type"] == "final" for m in messages)}
    middle = {m["type"] for m in messages[1:-1]}
    assert middle <= {"partial", "final"}
    wait_until(lambda: pool_is_full(client), what="pool back to full")
    assert stats(client)["finish_reasons"]["stop"] == 1


def test_audio_without_start_uses_16k_s16le(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, synthetic_pcm(1.0), start=None)
        messages, code = collect(ws)
    assert messages[0]["type"] == "ready" and messages[0]["sample_rate"] == 16000
    assert messages[-1]["finish_reason"] == "stop" and code == 1000


def test_f32le_at_48k_is_resampled_and_decoded(client: TestClient) -> None:
    samples = np.frombuffer(synthetic_pcm(1.5, sample_rate=48000), "<i2") / 32768.0
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, samples.astype("<f4").tobytes(),
                    {"type": "start", "sample_rate": 48000, "format": "f32le"})
        messages, code = collect(ws)
    assert [messages[0]["type"], messages[-1]["type"]] == ["ready", "done"]
    assert messages[-1]["finish_reason"] == "stop" and code == 1000


def test_second_start_is_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_json({"type": "start"})
        assert "second start" in assert_refused(ws, "bad_request", 1008)
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_start_after_audio_is_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_bytes(synthetic_pcm(0.1))
        ws.send_json({"type": "start", "sample_rate": 16000})
        assert "start after audio" in assert_refused(ws, "bad_request", 1008)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_bad_audio(client: TestClient, value: float) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "format": "f32le"})
        ws.send_bytes(struct.pack("<4f", 0.1, value, 0.2, 0.3))
        assert_refused(ws, "bad_audio", 1003)


def test_odd_byte_count_is_bad_audio(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_bytes(b"\x01\x02\x03")
        assert_refused(ws, "bad_audio", 1003)


@pytest.mark.parametrize("rate", [0, -16000, 7999, 192001, 10**12, 16000.5, "16000", True, None])
def test_absurd_sample_rates_are_refused(client: TestClient, rate: object) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "sample_rate": rate})
        assert_refused(ws, "unsupported", 1003)


def test_unknown_format_is_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "format": "mp3"})
        assert "mp3" in assert_refused(ws, "unsupported", 1003)


def test_oversized_frame_is_refused(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_frame_bytes=4096)
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_bytes(b"\x00" * 4098)
        assert "4098" in assert_refused(ws, "too_large", 1009)


def test_oversized_text_is_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_text(json.dumps({"type": "start", "pad": "x" * 10_000}))
        assert_refused(ws, "too_large", 1009)


@pytest.mark.parametrize("text", ["not json", "[1, 2]", "\"start\"", "42", "{\"type\": \"stop\"}",
                                  "{\"no_type\": 1}", "{\"type\": \"start\", \"rate\": 8000}"])
def test_malformed_or_unknown_messages_are_refused(client: TestClient, text: str) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_text(text)
        assert_refused(ws, "bad_request", 1008)


def test_audio_after_end_is_refused_and_the_final_follows(
        make_client: Callable[..., TestClient]) -> None:
    # backpressure off (30 s per socket): the server reads every frame as it comes
    client = make_client(max_socket_audio_s=30.0, max_queued_audio_s=30.0)
    pcm = synthetic_pcm(2.0)
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, pcm, {"type": "start"})
        clean, _ = collect(ws)
    # The engine steps nothing until the trailing messages were refused, so the stream cannot
    # end (and send its own done) before the server reads them, however loaded the machine.
    with client.websocket_connect("/ws/asr") as ws:
        with engine_held(client):
            stream_file(ws, pcm, {"type": "start"})
            ws.send_bytes(synthetic_pcm(0.2))
            error = ws.receive_json()
            ws.send_bytes(synthetic_pcm(0.2))  # refused too, unanswered: one error is enough
            ws.send_json({"type": "end"})  # a second end: the same
        messages, code = collect(ws)
    assert error["type"] == "error" and error["code"] == "bad_request", error
    assert "audio after end" in error["message"] and "final and done follow" in error["message"]
    assert code == 1000 and messages[-1]["type"] == "done", messages
    assert messages[-1]["finish_reason"] == "stop" and messages[-1]["segments"] >= 1
    finals = [m for m in messages if m["type"] == "final"]
    assert finals == [m for m in clean if m["type"] == "final"]  # what it would have been
    assert not [m for m in messages if m["type"] == "error"], messages
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_end_before_start_is_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "end"})
        assert_refused(ws, "bad_request", 1008)


def test_silent_client_before_start_times_out(make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.3})
    with client.websocket_connect("/ws/asr") as ws:
        assert "0.3 s" in assert_refused(ws, "timeout", 1008)


def test_idle_stream_ends_with_timeout(make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.5})
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        ws.send_bytes(synthetic_pcm(0.3))
        messages, code = collect(ws)
    assert messages[0]["type"] == "ready"
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "timeout"
    assert code == 1000
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_disconnect_mid_utterance_frees_the_stream(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(1.5)):
            ws.send_bytes(frame)
        assert ws.receive_json()["type"] == "ready"
    wait_until(lambda: stats(client)["finish_reasons"]["abort"] == 1, what="abort counted")
    wait_until(lambda: pool_is_full(client), what="pool back to full")
    assert stats(client)["streams"]["active"] == 0


def test_more_streams_than_slots_are_refused_busy(make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"max_batch_size": 1, "max_wait_time_s": 0.0})
    with client.websocket_connect("/ws/asr") as first:
        first.send_json({"type": "start"})
        assert first.receive_json()["type"] == "ready"
        with client.websocket_connect("/ws/asr") as second:
            second.send_json({"type": "start"})
            assert_refused(second, "busy", 1013)
        stream_file(first, synthetic_pcm(0.5), start=None)
        messages, code = collect(first)
    assert messages[-1]["finish_reason"] == "stop" and code == 1000


def test_waiting_stream_gets_the_slot_when_it_frees(make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"max_batch_size": 1, "max_wait_time_s": 30.0})
    with client.websocket_connect("/ws/asr") as first, \
            client.websocket_connect("/ws/asr") as second:
        first.send_json({"type": "start"})
        assert first.receive_json()["type"] == "ready"
        second.send_json({"type": "start"})
        wait_until(lambda: stats(client)["streams"]["waiting"] == 1, what="second stream waiting")
        stream_file(first, synthetic_pcm(0.5), start=None)
        assert collect(first)[0][-1]["finish_reason"] == "stop"
        assert second.receive_json()["type"] == "ready"
        stream_file(second, synthetic_pcm(0.5), start=None)
        messages, code = collect(second)
    assert messages[-1]["finish_reason"] == "stop" and code == 1000
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_connection_limit_refuses_busy(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_connections=1)
    with client.websocket_connect("/ws/asr") as first:
        first.send_json({"type": "start"})
        assert first.receive_json()["type"] == "ready"
        with client.websocket_connect("/ws/asr") as second:
            assert "1 /ws/asr connections" in assert_refused(second, "busy", 1013)
    metrics = client.get("/metrics").text
    assert 'oasr_rejected_connections_total{reason="max_connections"} 1.0' in metrics


def test_stream_at_the_capacity_ceiling_finishes_with_length(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"max_blocks_per_seq": 2, "endpoint": None})
    with client.websocket_connect("/ws/asr") as ws:
        stream_file(ws, synthetic_pcm(4.0), {"type": "start"})
        messages, code = collect(ws)
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "length"
    assert code == 1000
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_a_bad_client_does_not_disturb_another_stream(client: TestClient) -> None:
    pcm = frames(synthetic_pcm(1.5))
    with client.websocket_connect("/ws/asr") as good:
        good.send_json({"type": "start"})
        for frame in pcm[: len(pcm) // 2]:
            good.send_bytes(frame)
        with client.websocket_connect("/ws/asr") as bad:
            bad.send_json({"type": "start", "format": "f32le"})
            bad.send_bytes(struct.pack("<2f", math.nan, 0.0))
            assert_refused(bad, "bad_audio", 1003)
        for frame in pcm[len(pcm) // 2:]:
            good.send_bytes(frame)
        good.send_json({"type": "end"})
        messages, code = collect(good)
    assert messages[0]["type"] == "ready"
    assert messages[-1]["finish_reason"] == "stop" and code == 1000
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_foreign_origin_is_refused_own_and_listed_origins_accepted(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(allowed_origins=("https://demo.example",))
    with pytest.raises(WebSocketDisconnect) as refused, \
            client.websocket_connect("/ws/asr", headers={"origin": "https://evil.example"}):
        pass
    assert refused.value.code == 1008
    for origin in ("http://testserver", "https://demo.example"):
        with client.websocket_connect("/ws/asr", headers={"origin": origin}) as ws:
            stream_file(ws, synthetic_pcm(0.3), {"type": "start"})
            assert collect(ws)[0][-1]["type"] == "done"
    assert 'oasr_rejected_connections_total{reason="origin"} 1.0' in client.get("/metrics").text


def test_session_longer_than_max_session_ends_with_timeout(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.5, "max_session_s": 1.0})
    began = time.monotonic()
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start"})
        for frame in frames(synthetic_pcm(4.0)):  # keeps sending: never idle
            ws.send_bytes(frame)
            time.sleep(0.1)
            if time.monotonic() - began > 1.6:
                break
        messages, code = collect(ws)
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "timeout"
    assert code == 1000
    wait_until(lambda: pool_is_full(client), what="pool back to full")


def test_endpoint_resets_let_a_stream_run_past_the_ceiling(
        make_client: Callable[..., TestClient], blank_model_dir: Path) -> None:
    endpoint = EndpointConfig(rule1=EndpointRule(must_contain_speech=False,
                                                 min_trailing_silence_s=1.0),
                              rule2=None, rule3=None)
    client = make_client(engine={"model": str(blank_model_dir), "endpoint": endpoint})
    with client.websocket_connect("/ws/asr") as ws:  # 8 s: beyond one stream's 5.1 s ceiling
        stream_file(ws, synthetic_pcm(8.0), {"type": "start"})
        messages, code = collect(ws)
    # An all-blank model has no words, so no finals; the resets still free its blocks.
    assert messages[-1] == {"type": "done", "finish_reason": "stop", "segments": 0}
    assert code == 1000
    # the stats snapshot is rebuilt on the engine thread, at most SNAPSHOT_INTERVAL_S late
    wait_until(lambda: stats(client)["endpoints"].get("rule1", 0) >= 3,
               what="three or more rule1 endpoints counted")
    wait_until(lambda: pool_is_full(client), what="pool back to full")
