"""/v1/realtime?intent=transcription through TestClient, tiny model: the session's events,
manual commits, clear, and what bad input gets (an error event naming the field)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from server_helpers import pool_is_full, synthetic_pcm, wait_until
from starlette.testclient import TestClient, WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

pytestmark = pytest.mark.timeout(60)
URL = "/v1/realtime?intent=transcription"


def update(ws: WebSocketTestSession, audio_input: dict[str, Any]) -> dict[str, Any]:
    ws.send_json({"type": "session.update",
                  "session": {"type": "transcription", "audio": {"input": audio_input}}})
    return ws.receive_json()


def append(ws: WebSocketTestSession, pcm: bytes, piece: int = 9600) -> None:
    for i in range(0, len(pcm), piece):
        ws.send_json({"type": "input_audio_buffer.append",
                      "audio": base64.b64encode(pcm[i:i + piece]).decode()})


def receive_until(ws: WebSocketTestSession, kind: str) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(ws.receive_json())
        if events[-1]["type"] == kind:
            return events
        if kind != "error":
            assert events[-1]["type"] != "error", events[-1]


def assert_error(event: dict[str, Any], param: str | None, words: str) -> None:
    assert event["type"] == "error", event
    error = event["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error


def full(client: TestClient) -> None:
    wait_until(lambda: pool_is_full(client.get("/api/stats").json()), what="pool back to full")


def test_session_created_then_updated_with_the_rate(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created" and created["event_id"]
        audio = created["session"]["audio"]["input"]
        assert audio["format"] == {"type": "audio/pcm", "rate": 24000}
        assert audio["turn_detection"]["type"] == "server_vad"
        updated = update(ws, {"format": {"type": "audio/pcm", "rate": 16000},
                              "turn_detection": {"type": "server_vad",
                                                 "silence_duration_ms": 700}})
        assert updated["type"] == "session.updated"
        audio = updated["session"]["audio"]["input"]
        assert audio["format"]["rate"] == 16000
        assert audio["turn_detection"]["silence_duration_ms"] == 700


def test_beta_transcription_session_update(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "turn_detection": None,
            "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"}}})
        updated = ws.receive_json()
        assert updated["type"] == "transcription_session.updated"
        assert updated["session"]["turn_detection"] is None
        assert updated["session"]["input_audio_transcription"]["model"] == "gpt-4o-transcribe"


def test_manual_commit_gives_committed_then_completed(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        update(ws, {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None})
        append(ws, synthetic_pcm(2.0))
        ws.send_json({"type": "input_audio_buffer.commit", "event_id": "c1"})
        events = receive_until(ws, "conversation.item.input_audio_transcription.completed")
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        assert len(committed) == 1 and committed[0]["previous_item_id"] is None
        completed = events[-1]
        assert completed["item_id"] == committed[0]["item_id"]
        assert completed["usage"] == {"type": "duration", "seconds": 2.0}
        deltas = "".join(e["delta"] for e in events if e["type"].endswith(".delta"))
        assert all(e["item_id"] == completed["item_id"] for e in events[1:])
        assert isinstance(completed["transcript"], str) and deltas.strip() is not None
    full(client)


def test_append_before_session_update_uses_the_announced_default(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        assert ws.receive_json()["session"]["audio"]["input"]["format"]["rate"] == 24000
        append(ws, synthetic_pcm(1.0, 24000))
        wait_until(lambda: client.get("/api/stats").json()["streams"]["active"] == 1,
                   what="a stream for the appended audio")
        # with audio buffered, the rate can no longer change: a clear error, nothing lost
        # (server VAD's events for the random model's words may come first)
        ws.send_json({"type": "session.update", "session": {
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})
        assert_error(receive_until(ws, "error")[-1], "session", "commit or clear it first")
        ws.send_json({"type": "input_audio_buffer.clear"})
        receive_until(ws, "input_audio_buffer.cleared")
        assert update(ws, {"format": {"type": "audio/pcm", "rate": 16000}})["type"] == (
            "session.updated")
    full(client)


def test_commit_of_an_empty_buffer_is_an_error(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json({"type": "input_audio_buffer.commit", "event_id": "evt_9"})
        event = ws.receive_json()
        assert event["error"]["code"] == "input_audio_buffer_commit_empty"
        assert event["error"]["event_id"] == "evt_9"


@pytest.mark.parametrize(("audio_input", "param", "words"), [
    ({"format": {"type": "audio/pcmu"}}, "session.audio.input.format.type", "audio/pcm"),
    ({"format": {"type": "audio/pcm", "rate": 1000}}, "session.audio.input.format.rate",
     "8000"),
    ({"format": {"type": "audio/pcm", "rate": 10**9}}, "session.audio.input.format.rate",
     "192000"),
    ({"format": {"type": "audio/pcm", "rate": "fast"}}, "session.audio.input.format.rate",
     "number"),
    ({"turn_detection": {"type": "semantic_vad"}}, "session.audio.input.turn_detection.type",
     "server_vad or null"),
    ({"turn_detection": {"type": "server_vad", "silence_duration_ms": 5}},
     "session.audio.input.turn_detection.silence_duration_ms", "100..60000"),
    ({"noise_reduction": {"type": "near_field"}}, "session.audio.input.noise_reduction",
     "noise reduction"),
    ({"transcription": {"model": "x", "language": "fr"}},
     "session.audio.input.transcription.language", "English"),
    ({"speed": 2}, "session.audio.input.speed", "session.audio.input.speed"),
    ({"transcription": {"model": "x", "delay": "low"}},
     "session.audio.input.transcription.delay", "transcription.delay"),
])
def test_unsupported_session_fields_are_named(client: TestClient, audio_input: dict[str, Any],
                                              param: str, words: str) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        assert_error(update(ws, audio_input), param, words)
        # the session goes on with its settings unchanged
        assert update(ws, {})["session"]["audio"]["input"]["format"]["rate"] == 24000


@pytest.mark.parametrize(("message", "param", "words"), [
    ({"type": "input_audio_buffer.append", "audio": "***not base64***"}, "audio",
     "not valid base64"),
    ({"type": "input_audio_buffer.append", "audio": 12}, "audio", "base64 string"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()},
     "audio", "bad audio"),
    ({"type": "input_audio_buffer.append", "audio": "", "extra": 1}, "extra", "unknown"),
    ({"type": "response.create"}, "type", "not supported by a transcription session"),
    ({"type": "session.update", "session": {"type": "realtime"}}, "session.type",
     "transcription sessions only"),
    ({"type": "session.update", "session": {"tools": []}}, "session.tools", "session.tools"),
    ({"type": "session.update", "session": {"include": ["logprobs"]}}, "session.include",
     "logprobs"),
    ({"no_type": 1}, "type", "string 'type'"),
])
def test_bad_events_get_an_error_and_the_session_goes_on(
        client: TestClient, message: dict[str, Any], param: str, words: str) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json(message)
        assert_error(ws.receive_json(), param, words)
        ws.send_json({"type": "input_audio_buffer.clear"})
        assert ws.receive_json()["type"] == "input_audio_buffer.cleared"
    full(client)


def test_text_that_is_not_json_and_binary_frames_are_errors(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_text("{nope")
        assert_error(ws.receive_json(), None, "not JSON")
        ws.send_bytes(b"\x00\x01")
        assert_error(ws.receive_json(), None, "binary frames")


def test_oversized_event_is_an_error(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_frame_bytes=4096)
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        append(ws, bytes(9000), piece=9000)
        assert ws.receive_json()["error"]["code"] == "too_large"


def test_other_intents_are_refused(client: TestClient) -> None:
    with client.websocket_connect("/v1/realtime?intent=conversation") as ws:
        assert_error(ws.receive_json(), "intent", "transcription sessions only")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_a_client_that_leaves_mid_turn_frees_its_stream(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        append(ws, synthetic_pcm(1.5, 24000))
        wait_until(lambda: client.get("/api/stats").json()["streams"]["active"] == 1,
                   what="the stream running")
    full(client)
    assert client.get("/api/stats").json()["finish_reasons"]["abort"] == 1


def test_a_manual_buffer_the_engine_times_out_is_committed(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.5, "max_session_s": 60})
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        update(ws, {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None})
        append(ws, synthetic_pcm(1.0))
        events = receive_until(ws, "conversation.item.input_audio_transcription.completed")
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        assert [c["item_id"] for c in committed] == [events[-1]["item_id"]]
    assert client.get("/api/stats").json()["finish_reasons"]["timeout"] == 1


def test_a_dead_engine_is_a_server_error_event_not_a_dropped_session(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = client.app.state.context.engine  # type: ignore[attr-defined]

    def dead(*args: object, **kwargs: object) -> int:
        raise RuntimeError("the engine is not running: it failed with RuntimeError('x')")

    monkeypatch.setattr(engine, "open_stream", dead)
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        append(ws, synthetic_pcm(0.2, 24000))
        error = ws.receive_json()["error"]
        assert error["type"] == "server_error" and error["code"] == "internal", error
        assert "not running" in error["message"]
        ws.send_json({"type": "input_audio_buffer.clear"})
        assert ws.receive_json()["type"] == "input_audio_buffer.cleared"
