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
import json
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
