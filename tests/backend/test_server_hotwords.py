"""Hotwords over /ws/asr: in the start message and replaced mid-stream by a hotwords message
(taking effect from the stream's next chunk), echoed by ready and acknowledged; bad ones fail
that request only; partials and finals carry their words."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from server_helpers import DEFAULT_MODEL_DIR, engine_held, frames, synthetic_pcm
from starlette.testclient import TestClient, WebSocketTestSession
from support.paths import DEVSET_DIR

from backend.app import create_app
from backend.config import ServerConfig
from oasr.audio import read_audio
from oasr.decoding import GpuDecoderConfig
from oasr.engine import EngineConfig

DASHWOOD = DEVSET_DIR / "real_sense_and_sensibility_01_austen_64kb-0870.wav"  # "... john dashwood"


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    """The tiny test model decoded by beam search: its first pass takes hotword graphs."""
    return make_client(engine={"decoder": GpuDecoderConfig(beam_size=4)})


def _collect(ws: WebSocketTestSession) -> list[dict[str, Any]]:
    messages = []
    while True:
        message = ws.receive_json()
        messages.append(message)
        if message["type"] == "done":
            return messages


def test_start_hotwords_are_echoed_by_ready(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "sample_rate": 16000,
                      "hotwords": ["Brenvik", {"phrase": "Taloria", "boost": 4.5}]})
        ready = ws.receive_json()
        assert ready["type"] == "ready"
        assert ready["hotwords"] == [{"phrase": "Brenvik", "boost": 3.0},
                                     {"phrase": "Taloria", "boost": 4.5}]
        ws.send_json({"type": "end"})
        assert _collect(ws)[-1]["type"] == "done"


@pytest.mark.parametrize(("hotwords", "message"), [
    ("Brenvik", "must be a list"),
    ([f"t{i}" for i in range(101)], "at most 100"),
    ([{"phrase": "x", "boost": 99}], "boost 99"),
    (["R2D2"], "cannot write '2'"),  # the model's units cannot spell it
])
def test_bad_start_hotwords_fail_that_request_only(client: TestClient, hotwords: object,
                                                   message: str) -> None:
    with client.websocket_connect("/ws/asr") as other:
        other.send_json({"type": "start"})
        assert other.receive_json()["type"] == "ready"
        with client.websocket_connect("/ws/asr") as ws:
            ws.send_json({"type": "start", "hotwords": hotwords})
            error = ws.receive_json()
            assert (error["type"], error["code"]) == ("error", "bad_hotwords")
            assert message in error["message"]
        for frame in frames(synthetic_pcm(0.5)):
            other.send_bytes(frame)
        other.send_json({"type": "end"})
        assert _collect(other)[-1]["finish_reason"] == "stop"


def test_a_bad_hotwords_message_is_refused_and_the_stream_goes_on(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "hotwords": ["Brenvik"]})
        assert ws.receive_json()["type"] == "ready"
        ws.send_json({"type": "hotwords", "hotwords": ["ok", "R2D2"]})
        error = ws.receive_json()
        assert (error["type"], error["code"]) == ("error", "bad_hotwords")
        assert "keeps its hotwords" in error["message"]
        ws.send_json({"type": "hotwords", "hotwords": "nope"})
        assert ws.receive_json()["code"] == "bad_hotwords"
        ws.send_json({"type": "hotwords", "hotwords": ["Taloria"]})
        assert ws.receive_json() == {"type": "hotwords",
                                     "hotwords": [{"phrase": "Taloria", "boost": 3.0}]}
        # the engine steps nothing until the message after end was refused, so the stream
        # cannot end (and close the socket) before the server reads it
        with engine_held(client):
            for frame in frames(synthetic_pcm(0.5)):
                ws.send_bytes(frame)
            ws.send_json({"type": "end"})
            ws.send_json({"type": "hotwords", "hotwords": []})  # after end: refused, final kept
            refusal = ws.receive_json()
        assert refusal["code"] == "bad_request", refusal
        messages = _collect(ws)
        assert messages[-1]["finish_reason"] == "stop"


def test_hotwords_before_start_are_refused(client: TestClient) -> None:
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "hotwords", "hotwords": ["x"]})
        error = ws.receive_json()
        assert error["code"] == "bad_request" and "start" in error["message"]


@pytest.fixture
def real_client() -> Callable[[], TestClient]:
    """A server with the bundled model's CTC pass as oasr-server decodes it (beam search with
    its LMs), finals from the CTC pass."""
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("no bundled model")
    clients: list[TestClient] = []

    def make() -> TestClient:
        engine = EngineConfig(device="cpu", max_batch_size=2, max_num_blocks=2 * 64,
                              second_pass="none", refine=None,
                              decoder=GpuDecoderConfig(beam_size=16))
        config = ServerConfig(engine=engine, stats_interval_s=0.05, replica="",
                              allowed_hosts=("testserver",))
        client = TestClient(create_app(config))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _pcm(seconds_from: float, seconds_to: float | None = None) -> bytes:
    samples = read_audio(DASHWOOD)
    piece = samples[int(seconds_from * 16000): None if seconds_to is None
                    else int(seconds_to * 16000)]
    return (piece * 32768).clip(-32768, 32767).astype("<i2").tobytes()


def _run(client: TestClient, hotwords_at: float | None) -> list[dict[str, Any]]:
    """The recording over /ws/asr; with ``hotwords_at``, ["Dashwood"] sent as a hotwords
    message after that many seconds of audio."""
    messages: list[dict[str, Any]] = []
    with client.websocket_connect("/ws/asr") as ws:
        ws.send_json({"type": "start", "sample_rate": 16000})
        messages.append(ws.receive_json())
        cut = 0.0 if hotwords_at is None else hotwords_at
        for frame in frames(_pcm(0.0, cut)):
            ws.send_bytes(frame)
        if hotwords_at is not None:
            ws.send_json({"type": "hotwords", "hotwords": ["Dashwood"]})
            while True:  # partials may come first
                message = ws.receive_json()
                messages.append(message)
                if message["type"] == "hotwords":
                    break
        for frame in frames(_pcm(cut)):
            ws.send_bytes(frame)
        ws.send_json({"type": "end"})
        messages += _collect(ws)
    return messages


def _finals(messages: list[dict[str, Any]]) -> str:
    return " ".join(m["text"] for m in messages if m["type"] == "final")


@pytest.mark.slow
def test_hotwords_sent_mid_stream_apply_from_the_next_chunk(
        real_client: Callable[[], TestClient]) -> None:
    client = real_client()
    plain = _run(client, None)
    assert "dashwood" not in _finals(plain).split()  # "john dash wood"
    biased = _run(client, 0.64)  # after the first chunk, before the name is said
    assert biased[-1]["finish_reason"] == "stop"
    ack = next(i for i, m in enumerate(biased) if m["type"] == "hotwords")
    assert biased[ack]["hotwords"] == [{"phrase": "Dashwood", "boost": 3.0}]
    assert "dashwood" in _finals(biased).split()
    assert not any("dashwood" in m["text"].split() for m in biased[:ack]
                   if m["type"] == "partial")
    # every partial and final carries its words, timed inside what was decoded, in order
    for message in biased:
        if message["type"] not in ("partial", "final"):
            continue
        words = message["words"]
        assert [w["word"] for w in words] == message["text"].split()
        assert all(0.0 <= w["confidence"] <= 1.0 for w in words)
        assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(words, words[1:],
                                                                  strict=False))
        if message["type"] == "final":
            assert all(message["start"] - 1e-6 <= w["start"] <= w["end"]
                       <= message["end"] + 1e-6 for w in words)
    assert json.dumps(biased)  # plain JSON all through
