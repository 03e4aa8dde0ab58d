"""Realtime sessions that last (TestClient, tiny model): a session with no turn in flight stays
open; server VAD's idle_timeout_ms; empty commits after server VAD; and oasr's resume
extension (a drop is a close other than 1000 / 1001: these tests close with 4000)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_helpers import EVERY_SECOND, engine_held, pool_is_full, synthetic_pcm, wait_until
from starlette.testclient import TestClient, WebSocketTestSession
from starlette.websockets import WebSocketDisconnect
from test_openai_realtime import append, assert_error, receive_until, update

pytestmark = pytest.mark.timeout(60)
URL = "/v1/realtime?intent=transcription"
COMPLETED = "conversation.item.input_audio_transcription.completed"
DROP = 4000
MANUAL_16K = {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}
_SOCKETS = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _close_sockets(make_client: Callable[..., TestClient]) -> Iterator[None]:
    with _SOCKETS:  # torn down before the apps (set up after make_client)
        yield


def connect(client: TestClient, url: str = URL, **headers: str) -> WebSocketTestSession:
    return _SOCKETS.enter_context(client.websocket_connect(url, headers=dict(headers)))


def stats(client: TestClient, **headers: str) -> dict[str, Any]:
    return client.get("/api/stats", headers=headers).json()


def wait_gone(client: TestClient, **headers: str) -> None:
    """Until the server has seen every realtime socket go (works while the engine is held)."""
    wait_until(lambda: stats(client, **headers)["server"]["realtime_connections"] == 0,
               what="socket gone")


def resume(client: TestClient, token: str, last_event_id: str | None = None,
           **headers: str) -> WebSocketTestSession:
    url = f"{URL}&resume={token}" + (f"&last_event_id={last_event_id}" if last_event_id else "")
    return connect(client, url, **headers)


def vad_socket(client: TestClient, **turn_detection: Any) -> tuple[WebSocketTestSession,
                                                                   dict[str, Any]]:
    """A session at 16 kHz with server VAD (and ``turn_detection``'s other fields), and the
    session.updated that answered its update."""
    ws = connect(client)
    ws.receive_json()
    updated = update(ws, {"format": {"type": "audio/pcm", "rate": 16000},
                          "turn_detection": {"type": "server_vad", **turn_detection}})
    return ws, updated


def refused(ws: WebSocketTestSession, code: str) -> str:
    event = ws.receive_json()
    assert event["type"] == "error" and event["error"]["code"] == code, event
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_json()
    assert closed.value.code == 1008
    return str(event["error"]["message"])


# -- a session with no turn in flight ------------------------------------------------------
def test_a_session_without_a_turn_outlives_the_stream_idle_timeout(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.3, "max_session_s": 60})
    ws = connect(client)
    ws.receive_json()
    time.sleep(1.2)  # four idle timeouts: it used to get "timeout" and a close here
    assert update(ws, MANUAL_16K)["type"] == "session.updated"
    append(ws, synthetic_pcm(1.0))
    ws.send_json({"type": "input_audio_buffer.commit"})
    assert receive_until(ws, COMPLETED)[-1]["usage"]["seconds"] == 1.0


def test_a_quiet_session_ends_at_the_session_limit(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.3, "max_session_s": 0.8})
    ws = connect(client)
    ws.receive_json()
    event = ws.receive_json()
    assert event["error"]["code"] == "session_expired", event
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_json()
    assert closed.value.code == 1000


def test_a_turn_that_sends_nothing_still_frees_its_slot(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client({"idle_timeout_s": 0.3, "max_session_s": 60})
    ws = connect(client)
    ws.receive_json()
    update(ws, {"format": {"type": "audio/pcm", "rate": 16000}})
    append(ws, synthetic_pcm(0.5))
    wait_until(lambda: stats(client)["finish_reasons"].get("timeout", 0) == 1,
               what="the silent turn's stream ended by the engine")
    assert pool_is_full(stats(client))
    time.sleep(1.0)  # the session, holding no stream now, waits on
    assert update(ws, MANUAL_16K)["type"] == "session.updated"


# -- server VAD's idle_timeout_ms ----------------------------------------------------------
def test_idle_timeout_ms_triggers_a_timeout_and_an_empty_item(client: TestClient) -> None:
    ws, updated = vad_socket(client, idle_timeout_ms=300)
    assert updated["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 300
    began = time.monotonic()
    triggered = ws.receive_json()
    assert triggered["type"] == "input_audio_buffer.timeout_triggered", triggered
    assert time.monotonic() - began >= 0.25
    assert triggered["audio_start_ms"] == triggered["audio_end_ms"] == 0
    committed, completed = ws.receive_json(), ws.receive_json()
    assert committed["type"] == "input_audio_buffer.committed"
    assert committed["item_id"] == completed["item_id"] == triggered["item_id"]
    assert completed["type"] == COMPLETED and completed["transcript"] == ""
    assert ws.receive_json()["type"] == "input_audio_buffer.timeout_triggered"  # re-armed


def test_idle_timeout_ms_counts_the_audio_appended_while_quiet(
        make_client: Callable[..., TestClient], blank_model_dir: Path) -> None:
    client = make_client({"model": str(blank_model_dir)})  # it hears no speech, ever
    ws, _ = vad_socket(client, idle_timeout_ms=1500)
    append(ws, synthetic_pcm(1.0))
    triggered = receive_until(ws, "input_audio_buffer.timeout_triggered")[-1]
    assert (triggered["audio_start_ms"], triggered["audio_end_ms"]) == (0, 1000)


def test_idle_timeout_ms_out_of_range_is_named(client: TestClient) -> None:
    ws = connect(client)
    ws.receive_json()
    event = update(ws, {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5}})
    assert_error(event, "session.audio.input.turn_detection.idle_timeout_ms", "100..3600000")


# -- commits after server VAD ----------------------------------------------------------------
def vad_session(make_client: Callable[..., TestClient]) -> tuple[TestClient, WebSocketTestSession]:
    """Server VAD at 16 kHz whose segments end every 1.28 s; 2.64 s appended (the second
    end needs a little over 2.6 s: its chunk's last frame is whole) and two segments ended:
    what is left after them (80 ms) is under a commit's 100 ms, whenever the second end was
    decided (with 3.5 s appended, an end decided before the rest came in left a commit with
    audio: a race a loaded machine lost)."""
    client = make_client({"endpoint": EVERY_SECOND})
    ws, _ = vad_socket(client)
    append(ws, synthetic_pcm(2.64))
    wait_until(lambda: (entries := stats(client)["streams"]["list"]) and entries[0][
        "segment"] == 2, what="two segments ended")
    return client, ws


def test_a_commit_after_server_vad_committed_everything_is_empty(
        make_client: Callable[..., TestClient]) -> None:
    client, ws = vad_session(make_client)
    ws.send_json({"type": "input_audio_buffer.commit", "event_id": "c1"})
    error = receive_until(ws, "error")[-1]["error"]
    assert error["code"] == "input_audio_buffer_commit_empty" and error["event_id"] == "c1"


def test_a_commit_with_server_vad_is_answered_even_when_nothing_was_heard(
        make_client: Callable[..., TestClient], blank_model_dir: Path) -> None:
    client = make_client({"model": str(blank_model_dir)})  # it hears no speech, ever
    ws, _ = vad_socket(client)
    append(ws, synthetic_pcm(0.5))
    ws.send_json({"type": "input_audio_buffer.commit"})
    committed, completed = ws.receive_json(), ws.receive_json()
    assert committed["type"] == "input_audio_buffer.committed"
    assert completed["type"] == COMPLETED and completed["item_id"] == committed["item_id"]
    assert completed["transcript"] == "" and completed["usage"]["seconds"] == 0.5


# -- resume --------------------------------------------------------------------------------
def test_session_created_carries_a_resume_token(client: TestClient) -> None:
    created = connect(client).receive_json()
    assert created["resume_token"].startswith("oasr-resume-") and created["resume_window_s"] == 30


def test_a_dropped_session_resumes_with_its_buffer(client: TestClient) -> None:
    ws = connect(client)
    token = ws.receive_json()["resume_token"]
    update(ws, MANUAL_16K)
    append(ws, synthetic_pcm(1.0))
    wait_until(lambda: stats(client)["streams"]["active"] == 1, what="the turn's stream")
    ws.close(DROP)
    wait_until(lambda: stats(client)["streams"]["suspended"] == 1, what="turn suspended")
    ws = resume(client, token)
    created = ws.receive_json()
    assert created["type"] == "session.created" and created["resumed"] is True
    assert created["received_samples"] == 16000 and created["resume_token"] != token
    append(ws, synthetic_pcm(0.5, seed=2))
    ws.send_json({"type": "input_audio_buffer.commit"})
    assert receive_until(ws, COMPLETED)[-1]["usage"]["seconds"] == 1.5  # both sockets' audio
    assert stats(client)["streams"]["suspended"] == 0


def test_events_decided_while_away_arrive_on_resume(client: TestClient) -> None:
    ws = connect(client)
    token = ws.receive_json()["resume_token"]
    update(ws, MANUAL_16K)
    with engine_held(client):  # the transcript cannot come before the drop
        append(ws, synthetic_pcm(1.0))
        ws.send_json({"type": "input_audio_buffer.commit"})
        assert ws.receive_json()["type"] == "input_audio_buffer.committed"
        ws.close(DROP)
        wait_gone(client)
    wait_until(lambda: pool_is_full(stats(client)), what="the turn transcribed while away")
    ws = resume(client, token)
    assert ws.receive_json()["resumed"] is True
    assert receive_until(ws, COMPLETED)[-1]["usage"]["seconds"] == 1.0


def test_events_after_the_last_event_id_are_sent_again(client: TestClient) -> None:
    ws = connect(client)
    created = ws.receive_json()
    updated = update(ws, MANUAL_16K)
    ws.close(DROP)
    wait_gone(client)
    ws = resume(client, created["resume_token"], last_event_id=created["event_id"])
    assert ws.receive_json()["resumed"] is True
    assert ws.receive_json() == updated  # the same event, id and all


def test_a_replayed_realtime_token_is_refused(client: TestClient) -> None:
    ws = connect(client)
    token = ws.receive_json()["resume_token"]
    ws.close(DROP)
    wait_gone(client)
    assert resume(client, token).receive_json()["resumed"] is True
    assert "already used" in refused(resume(client, token), "resume_invalid")


def test_a_realtime_token_of_another_key_is_unknown(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_keys=("key-a", "key-b"))
    ws = connect(client, Authorization="Bearer key-a")
    token = ws.receive_json()["resume_token"]
    ws.close(DROP)
    wait_gone(client, Authorization="Bearer key-a")
    message = refused(resume(client, token, Authorization="Bearer key-b"), "resume_invalid")
    assert "unknown" in message
    assert resume(client, token, Authorization="Bearer key-a").receive_json()["resumed"]


def test_a_session_not_resumed_in_time_ends_and_its_turn_is_abandoned(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(resume_window_s=0.3)
    ws = connect(client)
    token = ws.receive_json()["resume_token"]
    update(ws, MANUAL_16K)
    append(ws, synthetic_pcm(1.0))
    wait_until(lambda: stats(client)["streams"]["active"] == 1, what="the turn's stream")
    ws.close(DROP)
    wait_until(lambda: stats(client)["finish_reasons"].get("abandoned", 0) == 1,
               what="the turn abandoned")
    refused(resume(client, token), "resume_expired")


def test_a_deliberate_close_ends_the_session(client: TestClient) -> None:
    ws = connect(client)
    token = ws.receive_json()["resume_token"]
    update(ws, MANUAL_16K)
    append(ws, synthetic_pcm(1.0))
    wait_until(lambda: stats(client)["streams"]["active"] == 1, what="the turn's stream")
    ws.close(1000)
    wait_until(lambda: stats(client)["finish_reasons"].get("abort", 0) == 1, what="abort")
    refused(resume(client, token), "resume_expired")
