"""Resuming a /ws/asr stream after its socket dropped (TestClient, a real engine thread, the tiny
model). A drop is a close other than 1000 / 1001: these tests close with 4000."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from server_helpers import EVERY_SECOND, engine_held, frames, synthetic_pcm, wait_until
from starlette.testclient import TestClient, WebSocketTestSession
from test_server_asr_socket import assert_refused, collect, pool_is_full, stats

pytestmark = pytest.mark.timeout(60)

DROP = 4000  # an application close code: not 1000 / 1001, so a drop
FRAME_SAMPLES = 1600  # frames() cuts 3,200 bytes: 100 ms of 16 kHz s16le
_SOCKETS = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _close_sockets(make_client: Callable[..., TestClient]) -> Iterator[None]:
    """Every test socket is exited before the apps stop (set up after ``make_client``, so
    torn down before it)."""
    with _SOCKETS:
        yield


def connect(client: TestClient, **headers: str) -> WebSocketTestSession:
    return _SOCKETS.enter_context(client.websocket_connect("/ws/asr", headers=dict(headers)))


def open_stream(client: TestClient, num_frames: int, **headers: str) -> tuple[
        WebSocketTestSession, dict[str, Any]]:
    """A connection that started a 16 kHz stream, got its ready and sent ``num_frames``."""
    ws = connect(client, **headers)
    ws.send_json({"type": "start", "sample_rate": 16000})
    ready = ws.receive_json()
    assert ready["type"] == "ready", ready
    for frame in frames(synthetic_pcm(num_frames * 0.1))[:num_frames]:
        ws.send_bytes(frame)
    return ws, ready


def drop(ws: WebSocketTestSession) -> None:
    ws.close(DROP)


def resume(client: TestClient, token: str, last_final: int | None = None,
           **headers: str) -> WebSocketTestSession:
    ws = connect(client, **headers)
    start: dict[str, Any] = {"type": "start", "resume": token}
    if last_final is not None:
        start["last_final"] = last_final
    ws.send_json(start)
    return ws


def send_frames(ws: WebSocketTestSession, num_frames: int) -> None:
    for frame in frames(synthetic_pcm(num_frames * 0.1))[:num_frames]:
        ws.send_bytes(frame)


def wait_disconnected(client: TestClient) -> None:
    """Until the server has seen every /ws/asr socket go (read from the server, not the
    engine: this works while the engine is held)."""
    wait_until(lambda: stats(client)["server"]["connections"] == 0, what="socket gone")


def suspended(client: TestClient) -> int:
    return int(stats(client)["streams"]["suspended"])


def finish(ws: WebSocketTestSession, num_frames: int = 0) -> tuple[list[dict[str, Any]], int]:
    for frame in frames(synthetic_pcm(num_frames * 0.1, seed=1))[:num_frames]:
        ws.send_bytes(frame)
    ws.send_json({"type": "end"})
    return collect(ws)


def test_ready_carries_a_resume_token_and_the_window(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(resume_window_s=12.0)
    ws, ready = open_stream(client, 0)
    assert ready["resume_token"].startswith("oasr-resume-") and len(ready["resume_token"]) > 40
    assert ready["resume_window_s"] == 12.0
    finish(ws)


def test_without_a_window_ready_has_no_token_and_a_drop_aborts(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(resume_window_s=0.0)
    ws, ready = open_stream(client, 5)
    assert "resume_token" not in ready
    drop(ws)
    wait_until(lambda: stats(client)["finish_reasons"].get("abort", 0) == 1, what="abort")
    assert suspended(client) == 0


def test_a_dropped_stream_is_suspended_then_resumes_where_its_audio_stopped(
        client: TestClient) -> None:
    ws, ready = open_stream(client, 7)
    drop(ws)
    wait_until(lambda: suspended(client) == 1, what="stream suspended")
    assert stats(client)["streams"]["active"] == 1  # it keeps its slot
    ws = resume(client, ready["resume_token"])
    resumed = ws.receive_json()
    assert resumed["type"] == "ready" and resumed["resumed"] is True
    assert resumed["stream_id"] == ready["stream_id"]
    assert resumed["received_samples"] == 7 * FRAME_SAMPLES
    assert resumed["resume_token"] != ready["resume_token"]
    wait_until(lambda: suspended(client) == 0, what="stream resumed")
    messages, close_code = finish(ws, 5)
    assert messages[-1]["type"] == "done" and messages[-1]["finish_reason"] == "stop"
    assert close_code == 1000
    wait_until(lambda: pool_is_full(client), what="pool free")


def test_received_samples_count_the_clients_own_rate_and_format(client: TestClient) -> None:
    ws = connect(client)
    ws.send_json({"type": "start", "sample_rate": 48000, "format": "f32le"})
    ready = ws.receive_json()
    ws.send_bytes(b"\x00" * 4 * 4800 * 3)  # 3 frames of 100 ms at 48 kHz, 4 bytes a sample
    drop(ws)
    ws = resume(client, ready["resume_token"])
    assert ws.receive_json()["received_samples"] == 3 * 4800
    finish(ws)


def test_finals_decided_while_away_arrive_on_resume_once(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"endpoint": EVERY_SECOND})
    ws, ready = open_stream(client, 0)
    with engine_held(client):  # nothing decoded before the drop
        send_frames(ws, 30)
        drop(ws)
        wait_disconnected(client)
    # 3 s in: two 1.28 s segments end while the client is away (the last 0.44 s is less than a
    # chunk and waits for more audio or the end)
    wait_until(lambda: stats(client)["streams"]["list"][0]["segment"] == 2,
               what="two segments decided while the client is away")
    ws = resume(client, ready["resume_token"])
    assert ws.receive_json()["resumed"] is True
    messages, _ = finish(ws)
    segments = [m["segment"] for m in messages if m["type"] == "final"]
    assert segments[:2] == [0, 1]  # decided while away: delivered on resume, in order
    assert segments == sorted(set(segments))  # none twice


def test_finals_the_client_has_are_not_sent_again(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(engine={"endpoint": EVERY_SECOND})
    ws, ready = open_stream(client, 30)
    finals: list[int] = []
    while len(finals) < 2:
        message = ws.receive_json()
        if message["type"] == "final":
            finals.append(message["segment"])
    drop(ws)
    ws = resume(client, ready["resume_token"], last_final=finals[-1])
    assert ws.receive_json()["resumed"] is True
    messages, _ = finish(ws)
    again = [m["segment"] for m in messages if m["type"] == "final"]
    assert again and min(again) > finals[-1]


def test_finals_after_the_clients_last_final_are_sent_again(
        make_client: Callable[..., TestClient]) -> None:
    """A socket that died unnoticed swallowed finals the server did send: the client's
    ``last_final`` says which it holds, and the rest come again."""
    client = make_client(engine={"endpoint": EVERY_SECOND})
    ws, ready = open_stream(client, 30)
    finals: list[dict[str, Any]] = []
    while len(finals) < 2:
        message = ws.receive_json()
        if message["type"] == "final":
            finals.append(message)
    drop(ws)
    ws = resume(client, ready["resume_token"], last_final=-1)
    assert ws.receive_json()["resumed"] is True
    replayed = [ws.receive_json() for _ in range(2)]
    assert replayed == finals
    finish(ws)


def test_a_deliberate_close_ends_the_stream_and_expires_its_token(client: TestClient) -> None:
    ws, ready = open_stream(client, 5)
    ws.close(1000)
    wait_until(lambda: stats(client)["finish_reasons"].get("abort", 0) == 1, what="abort")
    message = assert_refused(resume(client, ready["resume_token"]), "resume_expired", 1008)
    assert "ended" in message or "closed" in message


def test_a_drop_after_end_is_not_resumable(client: TestClient) -> None:
    ws, ready = open_stream(client, 0)
    with engine_held(client):  # the final and done cannot come before the drop
        send_frames(ws, 5)
        ws.send_json({"type": "end"})
        drop(ws)
        wait_disconnected(client)
    assert_refused(resume(client, ready["resume_token"]), "resume_expired", 1008)
    wait_until(lambda: suspended(client) == 0 and pool_is_full(client), what="stream freed")


def test_a_replayed_token_is_refused(client: TestClient) -> None:
    ws, ready = open_stream(client, 5)
    drop(ws)
    second = resume(client, ready["resume_token"])
    assert second.receive_json()["resumed"] is True
    message = assert_refused(resume(client, ready["resume_token"]), "resume_invalid", 1008)
    assert "already used" in message
    finish(second)


def test_an_unknown_token_is_refused(client: TestClient) -> None:
    message = assert_refused(resume(client, "oasr-resume-made-up"), "resume_invalid", 1008)
    assert "unknown" in message


def test_a_token_presented_with_another_key_is_unknown(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_keys=("key-a", "key-b"))
    owner, stranger = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    ws, ready = open_stream(client, 5, **owner)
    drop(ws)
    message = assert_refused(resume(client, ready["resume_token"], **stranger),
                             "resume_invalid", 1008)
    assert "unknown" in message
    ws = resume(client, ready["resume_token"], **owner)  # the owner's resume still works
    assert ws.receive_json()["resumed"] is True
    finish(ws)


def test_a_page_token_of_the_same_key_resumes(make_client: Callable[..., TestClient]) -> None:
    """The page reconnects with a freshly minted token: it acts for the same key."""
    client = make_client(api_keys=("key-a", "key-b"))

    def page_token(key: str) -> dict[str, str]:
        minted = client.post("/api/token", headers={"Authorization": f"Bearer {key}"}).json()
        return {"Sec-WebSocket-Protocol": f"openai-insecure-api-key.{minted['token']}"}

    ws, ready = open_stream(client, 5, **page_token("key-a"))
    drop(ws)
    assert_refused(resume(client, ready["resume_token"], **page_token("key-b")),
                   "resume_invalid", 1008)
    ws = resume(client, ready["resume_token"], **page_token("key-a"))
    assert ws.receive_json()["resumed"] is True
    finish(ws)


def test_after_the_window_the_stream_ends_abandoned_and_its_token_expired(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(resume_window_s=0.3)
    ws, ready = open_stream(client, 5)
    drop(ws)
    wait_until(lambda: stats(client)["finish_reasons"].get("abandoned", 0) == 1,
               what="stream abandoned")
    assert pool_is_full(client) and suspended(client) == 0
    message = assert_refused(resume(client, ready["resume_token"]), "resume_expired", 1008)
    assert "abandoned" in message


def test_a_resume_takes_the_stream_from_a_socket_the_server_still_holds(
        client: TestClient) -> None:
    """The client came back before the server noticed its old socket had died."""
    old, ready = open_stream(client, 5)
    ws = resume(client, ready["resume_token"])
    resumed = ws.receive_json()
    assert resumed["resumed"] is True and resumed["received_samples"] == 5 * FRAME_SAMPLES
    assert collect(old)[1] == 1008  # the old socket is closed
    messages, close_code = finish(ws, 3)
    assert messages[-1]["finish_reason"] == "stop" and close_code == 1000
    wait_until(lambda: pool_is_full(client), what="pool free")


def test_a_resume_takes_the_streams_own_format_only(client: TestClient) -> None:
    ws, ready = open_stream(client, 5)
    drop(ws)
    bad = connect(client)
    bad.send_json({"type": "start", "resume": ready["resume_token"], "sample_rate": 8000})
    assert "unknown fields" in assert_refused(bad, "bad_request", 1008)
    ws = resume(client, ready["resume_token"])  # the refused start did not spend the token
    assert ws.receive_json()["resumed"] is True
    finish(ws)


def test_a_resume_on_a_server_without_a_window_is_refused(
        make_client: Callable[..., TestClient]) -> None:
    client = make_client(resume_window_s=0.0)
    assert_refused(resume(client, "oasr-resume-anything"), "resume_invalid", 1008)


def test_a_resumed_ready_echoes_the_streams_current_hotwords(client: TestClient) -> None:
    ws = connect(client)
    ws.send_json({"type": "start", "hotwords": ["alpha"]})
    ready = ws.receive_json()
    ws.send_json({"type": "hotwords", "hotwords": ["bravo"]})
    echoed = ws.receive_json()
    assert echoed["type"] == "hotwords", echoed
    drop(ws)
    ws = resume(client, ready["resume_token"])
    resumed = ws.receive_json()
    assert [h["phrase"] for h in resumed["hotwords"]] == ["bravo"]
    finish(ws)
