"""Nothing a client does costs another client its words (#47): each probe reproduced on loopback
against a real ``oasr-server`` with small limits, so that every test takes seconds.

- full-speed senders are slowed by backpressure, never cut by the websocket keepalive;
- a decompression bomb is refused from its header, or decoded a block at a time;
- an upload whose client left is cancelled, its stream ended within 2 s;
- deep JSON on the realtime socket gets an ``error`` event and the session goes on;
- a request body trickled byte by byte is closed within the header timeout's order;
- audio after ``end`` is refused and the final is kept; upload errors name no server path; a
  client leaving mid-upload is no ERROR in the log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import (
    ClientResult,
    Clip,
    assert_clean_finish,
    offline_results,
    server_flags,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BOMB_S = 600  # ten minutes of 192 kHz stereo silence: 0.43 MiB of FLAC, 0.9 GB of float32
MAX_RSS_GROWTH = 300 * 2**20
# uploads of many minutes: the default bounded history (old chunks evicted), not server_flags'
# unlimited history whose per-stream ceiling would end a stream with "length" after 10 s
UPLOAD_FLAGS = ("--max-batch-size", "2", "--max-wait", "30")
FULL_SPEED_CLIENTS = 8
FULL_SPEED_CLIP_S = 30.0
FULL_SPEED_BLOCKS = 64  # 41 s per stream: a 30 s clip ends "stop", not "length"
SECOND = 32_000  # bytes of 1 s of 16 kHz s16le


def joined_clip(clips: list[Clip], first: int, seconds: float, path: Path) -> Clip:
    """The clips from ``first`` on (wrapping), joined into one of ``seconds``."""
    samples = np.concatenate([clips[(first + i) % len(clips)].samples
                              for i in range(len(clips))])[:int(seconds * 16000)]
    soundfile.write(str(path), samples, 16000, subtype="PCM_16")
    return Clip(path, samples)


async def _collect(ws: Any, result: ClientResult) -> None:
    try:
        async for message in ws:
            result.messages.append(json.loads(message))
    except ConnectionClosed:
        pass


async def full_speed(url: str, pcm: bytes) -> ClientResult:
    """Send ``pcm`` in 1 s frames as fast as the server reads, client pings off; then end."""
    result = ClientResult()
    async with connect(url, ping_interval=None, max_size=2**22, open_timeout=30) as ws:
        receiver = asyncio.create_task(_collect(ws, result))
        try:
            await ws.send(json.dumps({"type": "start"}))
            for offset in range(0, len(pcm), SECOND):
                await ws.send(pcm[offset:offset + SECOND])
            await ws.send(json.dumps({"type": "end"}))
        except ConnectionClosed:
            pass  # cut: the receiver has the close
        await asyncio.wait_for(receiver, 120)
    result.close_code = ws.close_code
    return result


def test_full_speed_clients_are_slowed_by_backpressure_not_cut_by_the_keepalive(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        tmp_path: Path) -> None:
    # pings every 0.5 s, each to be answered within 0.5 s; a socket is not read while its stream
    # has 0.5 s queued: a pong waits behind seconds of audio the server holds back
    server = checked_server(random_model_dir, *server_flags(
        FULL_SPEED_CLIENTS, blocks_per_stream=FULL_SPEED_BLOCKS,
        extra=("--ws-ping", "0.5", "--max-socket-audio", "0.5", "--max-queued-audio", "2")))
    floods = [joined_clip(clips, 4 * i, FULL_SPEED_CLIP_S, tmp_path / f"flood{i}.wav")
              for i in range(FULL_SPEED_CLIENTS)]
    expected = offline_results(random_model_dir, floods, FULL_SPEED_BLOCKS)

    async def everyone() -> list[ClientResult]:
        return list(await asyncio.gather(*(full_speed(server.ws_url, f.pcm()) for f in floods)))

    results = asyncio.run(everyone())
    closes = [(r.close_code, r.finish_reason) for r in results]
    for index, (result, reference) in enumerate(zip(results, expected, strict=True)):
        assert_clean_finish(result, [s["text"] for s in reference.segments],
                            f"full-speed client {index} (all: {closes})")
    assert server.stats()["server"]["num_flow_pauses"] >= FULL_SPEED_CLIENTS


def test_a_full_speed_realtime_client_is_slowed_by_backpressure_and_transcribed_whole(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        tmp_path: Path) -> None:
    # an OpenAI realtime client appending a recording as fast as the server reads: its socket
    # is not read while its stream has 0.5 s queued (else the engine would queue it all)
    server = checked_server(random_model_dir, *server_flags(
        2, blocks_per_stream=FULL_SPEED_BLOCKS,
        extra=("--max-socket-audio", "0.5", "--max-queued-audio", "2")))
    clip = joined_clip(clips, 0, 20.0, tmp_path / "clip.wav")
    expected = [s["text"] for s in offline_results(random_model_dir, [clip],
                                                   FULL_SPEED_BLOCKS)[0].segments]
    url = f"ws://{server.address}/v1/realtime?intent=transcription"

    async def session() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        pcm = clip.pcm()
        async with connect(url, max_size=2**22, open_timeout=30) as ws:
            events.append(json.loads(await ws.recv()))  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}}))
            for offset in range(0, len(pcm), SECOND):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio":
                                          base64.b64encode(pcm[offset:offset + SECOND]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while events[-1]["type"] != "conversation.item.input_audio_transcription.completed":
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        return events

    events = asyncio.run(session())
    assert not [e for e in events if e["type"] == "error"], events
    assert events[-1]["transcript"] == " ".join(t for t in expected if t)
    assert server.stats()["server"]["num_flow_pauses"] >= 1


def test_deep_json_on_realtime_gets_an_error_event_and_the_session_goes_on(
        checked_server: Callable[..., Any], random_model_dir: Path) -> None:
    server = checked_server(random_model_dir, *server_flags(2))
    url = f"ws://{server.address}/v1/realtime?intent=transcription"

    async def session() -> tuple[list[dict[str, Any]], int | None]:
        events = []
        async with connect(url, open_timeout=30) as ws:
            events.append(json.loads(await ws.recv()))  # session.created
            await ws.send("[" * 1000 + "]" * 1000)
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        return events, ws.close_code

    (created, error, updated), close_code = asyncio.run(session())
    assert created["type"] == "session.created"
    assert error["type"] == "error", error
    assert "deeper than" in error["error"]["message"], error
    assert updated["type"] == "session.updated", updated
    assert close_code == 1000


def test_audio_after_end_is_refused_and_the_final_kept(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        tmp_path: Path) -> None:
    server = checked_server(random_model_dir, *server_flags(2))
    # 9 s sent at full speed: at `end` the engine still has seconds of audio to decode, so the
    # extra frame, sent right behind `end`, reaches the server before the stream can finish
    clip = joined_clip(clips, 0, 9.0, tmp_path / "clip.wav")
    expected = [s["text"] for s in offline_results(random_model_dir, [clip], 16)[0].segments]

    async def client() -> ClientResult:
        result = ClientResult()
        pcm = clip.pcm()
        async with connect(server.ws_url, max_size=2**22, open_timeout=30) as ws:
            receiver = asyncio.create_task(_collect(ws, result))
            await ws.send(json.dumps({"type": "start"}))
            for offset in range(0, len(pcm), 3200):
                await ws.send(pcm[offset:offset + 3200])
            await ws.send(json.dumps({"type": "end"}))
            await ws.send(pcm[:3200])
            await asyncio.wait_for(receiver, 60)
        result.close_code = ws.close_code
        return result

    result = asyncio.run(client())
    errors = result.errors
    assert len(errors) == 1 and errors[0]["code"] == "bad_request", result.messages
    assert "audio after end" in errors[0]["message"]
    result.messages.remove(errors[0])
    assert_clean_finish(result, expected, "the client that sent audio after end")


def trickle_until_closed(address: str, head: bytes, byte_every_s: float,
                         give_up_s: float) -> tuple[float | None, bytes]:
    """Send ``head``, then one body byte every ``byte_every_s``. Returns the seconds until the
    server closed the connection (None: still open after ``give_up_s``) and what it sent."""
    host, port = address.split(":")
    received = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        sock.settimeout(byte_every_s)
        began = time.monotonic()
        while time.monotonic() - began < give_up_s:
            try:
                sock.sendall(b"x")
                chunk = sock.recv(4096)
            except TimeoutError:
                continue  # nothing from the server yet: the next byte
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - began, received
            if not chunk:
                return time.monotonic() - began, received
            received += chunk
        return None, received


def test_a_trickled_body_is_closed_within_the_header_timeout(
        checked_server: Callable[..., Any], random_model_dir: Path) -> None:
    server = checked_server(random_model_dir, *server_flags(2, extra=("--header-timeout", "1")))
    # a well-formed multipart upload whose file part then comes at 10 bytes a second
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {server.address}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
            "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
            ).encode()
    closed_after, response = trickle_until_closed(server.address, head, 0.1, give_up_s=10.0)
    assert closed_after is not None, f"a body sent at 10 bytes/s was never timed out: {response}"
    # 1 s for the body, plus 1 s per 1,000 bytes received (a few dozen here)
    assert closed_after < 3.0, closed_after
    assert response.startswith(b"HTTP/1.1 408 "), response
    assert server.is_healthy()


def peak_rss_bytes(server: Any) -> int:
    """The server process's peak resident memory so far (Linux ``VmHWM``)."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def multipart(file_bytes: bytes, filename: str, **fields: str) -> tuple[str, bytes]:
    """A transcription request's multipart body (model "m", ``fields``, the file):
    (content type, body)."""
    boundary = uuid.uuid4().hex
    parts = "".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                    f"{value}\r\n" for name, value in {"model": "m", **fields}.items())
    body = (parts + f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            ).encode() + file_bytes + f"\r\n--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def transcribe(server: Any, file_bytes: bytes, filename: str) -> tuple[int, dict[str, Any]]:
    content_type, body = multipart(file_bytes, filename)
    request = urllib.request.Request(f"{server.url}v1/audio/transcriptions", data=body,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A FLAC of BOMB_S seconds of 192 kHz stereo silence, written a second at a time."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.flac"
    with soundfile.SoundFile(str(path), "w", 192000, 2, subtype="PCM_16", format="FLAC") as out:
        second = np.zeros((192000, 2), dtype=np.int16)
        for _ in range(BOMB_S):
            out.write(second)
    data = path.read_bytes()
    assert len(data) < 2**20, len(data)
    return data


def test_a_decompression_bomb_over_the_duration_limit_is_refused_from_its_header(
        checked_server: Callable[..., Any], random_model_dir: Path, bomb: bytes) -> None:
    server = checked_server(random_model_dir, *server_flags(2, extra=("--max-upload-audio", "60")))
    peak = peak_rss_bytes(server)
    status, body = transcribe(server, bomb, "bomb.flac")
    assert status == 413, body
    assert body["error"]["param"] == "file" and body["error"]["code"] == "audio_too_long"
    assert "600.0 s of audio; the limit is 60 s" in body["error"]["message"], body
    assert peak_rss_bytes(server) - peak < MAX_RSS_GROWTH
    assert server.stats()["streams"]["active"] == 0


def test_a_decompression_bomb_under_the_limit_is_decoded_a_block_at_a_time(
        checked_server: Callable[..., Any], random_model_dir: Path, bomb: bytes) -> None:
    server = checked_server(random_model_dir, *UPLOAD_FLAGS)  # 3,600 s of audio allowed
    peak = peak_rss_bytes(server)
    status, body = transcribe(server, bomb, "bomb.flac")
    growth = peak_rss_bytes(server) - peak
    assert status == 200, body
    assert body["usage"] == {"type": "duration", "seconds": float(BOMB_S)}
    assert server.stats()["finish_reasons"]["stop"] == 1  # all of it went through the engine
    # decoded whole it was 0.9 GB of float32 samples (+1.36 GB of peak RSS)
    assert growth < MAX_RSS_GROWTH, f"peak RSS grew {growth / 2**20:.0f} MiB"


@pytest.fixture(scope="module")
def long_upload(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """20 minutes of faint 16 kHz noise as FLAC (16 MiB): minutes of engine work."""
    path = tmp_path_factory.mktemp("long") / "long.flac"
    rng = np.random.default_rng(0)
    with soundfile.SoundFile(str(path), "w", 16000, 1, subtype="PCM_16", format="FLAC") as out:
        for _ in range(20 * 60):
            out.write((rng.standard_normal(16000) * 30).astype(np.int16))
    return path.read_bytes()


def wait_for_stats(server: Any, predicate: Callable[[dict[str, Any]], bool], what: str,
                   timeout_s: float) -> float:
    """Poll the server's stats until ``predicate``; the seconds it took."""
    began = time.monotonic()
    while not predicate(server.stats()):
        assert time.monotonic() - began < timeout_s, f"{what} not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.parametrize("stream", ["false", "true"])  # one JSON answer, or server-sent events
def test_an_upload_whose_client_left_is_cancelled_within_2_s(
        checked_server: Callable[..., Any], random_model_dir: Path, long_upload: bytes,
        stream: str) -> None:
    server = checked_server(random_model_dir, *UPLOAD_FLAGS, "--max-upload-mb", "64")
    content_type, body = multipart(long_upload, "long.flac", stream=stream)
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {server.address}\r\n"
                      f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
                      ).encode() + body)
        wait_for_stats(server, lambda s: s["streams"]["active"] == 1, "the upload's stream", 30)
        time.sleep(1.0)  # decoding
    # the client gave up: its stream must end, not decode the rest of 20 minutes
    waited = wait_for_stats(server, lambda s: s["streams"]["active"] == 0,
                            "the abandoned stream's end", 30)
    assert waited < 2.0, waited
    assert server.stats()["finish_reasons"]["abort"] == 1


def test_an_undecodable_upload_is_400_naming_the_file_not_a_server_path(
        checked_server: Callable[..., Any], random_model_dir: Path) -> None:
    server = checked_server(random_model_dir, *server_flags(2))
    status, body = transcribe(server, b"this is not audio at all" * 10, "notes.wav")
    assert status == 400, body
    message = body["error"]["message"]
    assert "'notes.wav' is not audio oasr can decode" in message, message
    assert tempfile.gettempdir() not in message and "/tmp" not in message, message


def test_a_client_leaving_mid_upload_is_no_error_in_the_log(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip]) -> None:
    server = checked_server(random_model_dir, *server_flags(2))
    host, port = server.address.split(":")
    content_type, body = multipart(clips[0].samples.tobytes() * 10, "speech.wav")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {server.address}\r\n"
                      f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
                      ).encode() + body[:len(body) // 2])
        time.sleep(0.5)  # the server has read what there is and waits for the rest
    # the server has seen the client go: an INFO line (an ERROR with a traceback before)
    deadline = time.monotonic() + 10
    log = server.log_path.read_text()
    while "the client left during its upload" not in log and "ERROR" not in log:
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.1)
        log = server.log_path.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
