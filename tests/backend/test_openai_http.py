"""POST /v1/audio/transcriptions and GET /v1/models through TestClient, tiny model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from server_helpers import pool_is_full, wait_until, wav_bytes
from starlette.testclient import TestClient

pytestmark = pytest.mark.timeout(60)
URL = "/v1/audio/transcriptions"


def post(client: TestClient, data: dict[str, object] | None = None,
         file: bytes | None = None, name: str = "speech.wav") -> object:
    files = {"file": (name, file, "audio/wav")} if file is not None else None
    return client.post(URL, data={"model": "whisper-1", **(data or {})}, files=files)


def assert_error(response: object, status: int, param: str | None, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"], error


def test_json_is_the_default_and_carries_duration(client: TestClient) -> None:
    response = post(client, file=wav_bytes(2.0))
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body["text"], str)
    assert body["usage"] == {"type": "duration", "seconds": 2.0}
    wait_until(lambda: pool_is_full(client.get("/api/stats").json()), what="pool back to full")


def test_every_format_has_its_shape(client: TestClient) -> None:
    texts = {}
    for kind in ("text", "srt", "vtt", "verbose_json"):
        granularity = {"timestamp_granularities[]": "segment"} if kind == "verbose_json" else {}
        response = post(client, {"response_format": kind, **granularity}, wav_bytes(2.0))
        assert response.status_code == 200, response.text
        texts[kind] = response.text
    assert texts["text"].endswith("\n")
    assert texts["vtt"].startswith("WEBVTT\n")
    verbose = json.loads(texts["verbose_json"])
    assert verbose["task"] == "transcribe" and verbose["duration"] == 2.0
    assert verbose["language"] == "english"
    for segment in verbose["segments"]:
        assert 0.0 <= segment["start"] <= segment["end"] <= 2.0 + 0.5
        assert segment["text"] in verbose["text"]
        assert "--> " in texts["srt"] and segment["text"] in texts["vtt"]
    # the same audio through the same engine: one transcript whatever the format
    assert texts["text"].strip() == verbose["text"]


def test_stream_sends_deltas_then_done(client: TestClient) -> None:
    with client.stream("POST", URL, data={"model": "m", "stream": "true"},
                       files={"file": ("a.wav", wav_bytes(2.0), "audio/wav")}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                  if line.startswith("data: ")]
    assert events[-1]["type"] == "transcript.text.done"
    deltas = [e["delta"] for e in events[:-1]]
    assert all(e["type"] == "transcript.text.delta" for e in events[:-1])
    assert "".join(deltas) == events[-1]["text"]


def test_models_lists_the_served_family(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["oasr-conformer-ctc"]


@pytest.mark.parametrize(("data", "file", "param", "words"), [
    ({}, b"", "file", "is empty (0 bytes)"),
    ({}, b"this is not audio at all, just text" * 10, "file", "not audio oasr can decode"),
    ({}, None, "file", "'file' is required"),
    ({"model": ""}, b"x", "model", "'model' is required"),
    ({"response_format": "xml"}, b"x", "response_format", "use one of"),
    ({"language": "de"}, b"x", "language", "English"),
    ({"temperature": "hot"}, b"x", "temperature", "must be a number"),
    ({"temperature": "3"}, b"x", "temperature", "outside 0..1"),
    ({"timestamp_granularities[]": "word"}, b"x", "timestamp_granularities[]",
     "needs response_format=verbose_json"),
    ({"timestamp_granularities[]": "letter", "response_format": "verbose_json"}, b"x",
     "timestamp_granularities[]", "'word' or 'segment'"),
    ({"stream": "true", "response_format": "srt"}, b"x", "stream", "json or text"),
    ({"diarize": "yes"}, b"x", "diarize", "unknown or unsupported fields ['diarize']"),
])
def test_bad_requests_are_400_naming_the_field(
        client: TestClient, data: dict[str, object], file: bytes | None, param: str,
        words: str) -> None:
    assert_error(post(client, data, file), 400, param, words)


def test_nan_samples_are_400(client: TestClient) -> None:
    import io

    import numpy as np
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, np.full(1600, np.nan, dtype="float32"), 16000, format="WAV",
             subtype="FLOAT")
    assert_error(post(client, file=buffer.getvalue()), 400, "file", "NaN")


@pytest.fixture
def small_limit_client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(max_upload_bytes=8192)


def test_content_length_over_the_limit_is_413_before_reading(
        small_limit_client: TestClient) -> None:
    response = small_limit_client.post(URL, content=b"x" * 10,
                                       headers={"content-length": str(2 * 1024**3),
                                                "content-type": "multipart/form-data; b=x"})
    assert_error(response, 413, None, "larger than the limit of 8192 bytes")


def test_a_chunked_body_over_the_limit_is_413_while_reading(
        small_limit_client: TestClient) -> None:
    def body() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
        for _ in range(16):
            yield b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n" + b"y" * 1024
    response = small_limit_client.post(
        URL, content=body(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert_error(response, 413, None, "larger than the limit")
    small_limit_client.get("/healthz").raise_for_status()


def test_a_file_over_the_limit_is_413(small_limit_client: TestClient) -> None:
    assert_error(post(small_limit_client, file=wav_bytes(1.0)), 413, None, "limit of 8192")


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])
def test_a_streamed_answer_runs_its_cleanup_when_the_client_has_gone(spec_version: str) -> None:
    """A send that fails (the client left mid-stream) ends the response; the body's ``finally``
    (where the upload is closed and the stream aborted) runs then, not when a garbage
    collection finds the generator."""
    import asyncio
    import gc

    from starlette.requests import ClientDisconnect

    from backend.openai_http import ClosingStreamingResponse

    cleaned: list[str] = []

    async def body():  # noqa: ANN202 - an async generator
        try:
            for i in range(100):
                yield f"data: {i}\n\n".encode()
        finally:
            await asyncio.sleep(0)  # the cleanup awaits, as closing an upload does
            cleaned.append("closed")

    async def receive() -> dict[str, str]:
        await asyncio.sleep(3600)  # the client sends nothing more
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)
        if message.get("type") == "http.response.body" and len(sent) > 2:
            raise OSError("the client has gone")

    async def respond() -> None:
        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        response = ClosingStreamingResponse(body(), media_type="text/event-stream")
        with pytest.raises((ClientDisconnect, OSError)):
            await response(scope, receive, send)

    gc.disable()  # no collection may run the cleanup in the test's place
    try:
        asyncio.run(respond())
        assert cleaned == ["closed"]
    finally:
        gc.enable()
