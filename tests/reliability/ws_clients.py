"""Loopback ``/ws/asr`` clients for the reliability tests, and the offline references.

A client streams int16 PCM in 100 ms frames (at real-time pace or as fast as it can), sends
``end`` and collects every server message until the close; or it vanishes mid-utterance (a
TCP reset or a close frame without ``end``). References come from the same model through
``oasr.engine.transcribe_files``: the streaming path must give exactly the same segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from oasr.engine import EngineConfig, transcribe_files
from oasr.engine.offline import FileResult

FRAME_S = 0.1
BLOCKS_PER_STREAM = 16  # 16 chunks of 640 ms: 10 s per stream before "length"
SAMPLE_RATE = 16000
CLOSE_TIMEOUT_S = 60.0
# The close code that follows each error code (the websocket protocol); nothing else is acceptable.
ERROR_CLOSE_CODES = {"bad_request": 1008, "unsupported": 1003, "bad_audio": 1003,
                     "too_large": 1009, "timeout": 1008, "busy": 1013, "draining": 1013,
                     "internal": 1011}


def server_flags(max_batch_size: int, *, blocks_per_stream: int = BLOCKS_PER_STREAM,
                 max_wait_s: float = 30.0, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``oasr-server`` flags: ``max_batch_size`` slots, each able to hold ``blocks_per_stream``.

    No second pass: finals are the streaming CTC decoder's own, as ``transcribe_files`` gives.
    Unlimited history, as `EngineConfig`'s default (the commands default to 8 chunks): the
    offline references are made with EngineConfig, and a stream must be able to reach the ceiling.
    """
    return ("--second-pass", "none", "--num-left-chunks", "-1",
            "--max-batch-size", str(max_batch_size),
            "--max-num-blocks", str(max_batch_size * blocks_per_stream),
            "--max-wait", str(max_wait_s), *extra)


@dataclass
class ClientResult:
    """Everything one client saw: the server's messages in order and the close code."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)  # loop time of each message
    close_code: int | None = None
    vanished: bool = False

    def time_of(self, kind: str) -> float:
        """When the first message of type ``kind`` arrived (the event loop's clock)."""
        return next(t for t, m in zip(self.received_at, self.messages, strict=True)
                    if m["type"] == kind)

    @property
    def finals(self) -> list[str]:
        return [m["text"] for m in self.messages if m["type"] == "final"]

    @property
    def finish_reason(self) -> str | None:
        done = [m for m in self.messages if m["type"] == "done"]
        return done[-1]["finish_reason"] if done else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "error"]

    @property
    def got_ready(self) -> bool:
        return any(m["type"] == "ready" for m in self.messages)


@dataclass(frozen=True)
class Clip:
    """A piece of real speech: ``samples`` (N,) int16 at 16 kHz, also written to ``path``."""

    path: Path
    samples: np.ndarray

    def pcm(self, fmt: str = "s16le") -> bytes:
        if fmt == "s16le":
            return self.samples.astype("<i2").tobytes()
        return (self.samples.astype(np.float32) / 32768.0).astype("<f4").tobytes()


def make_clips(devset_dir: Path, num_clips: int, seconds: float, out_dir: Path) -> list[Clip]:
    """``num_clips`` distinct clips of ``seconds``: the devset's wavs in turn, each reuse of a
    file starting 0.5 s later."""
    names = sorted(p.name for p in devset_dir.glob("*.wav"))
    clips = []
    for index in range(num_clips):
        audio, rate = soundfile.read(str(devset_dir / names[index % len(names)]), dtype="int16")
        assert rate == SAMPLE_RATE, f"{names[index % len(names)]} is {rate} Hz"
        start = int((index // len(names)) * 0.5 * SAMPLE_RATE)
        samples = audio[start:start + int(seconds * SAMPLE_RATE)]  # (N,) int16
        path = out_dir / f"clip{index:02d}.wav"
        soundfile.write(str(path), samples, SAMPLE_RATE, subtype="PCM_16")
        clips.append(Clip(path, samples))
    return clips


def offline_results(model_dir: Path, clips: list[Clip], blocks_per_stream: int) -> list[
        FileResult]:
    """Each clip through ``transcribe_files`` (all clips in one engine, same pool per stream)."""
    config = EngineConfig(
        model=str(model_dir), device="cpu", max_batch_size=len(clips),
        max_num_blocks=len(clips) * blocks_per_stream, max_wait_time_s=math.inf,
        idle_timeout_s=math.inf, max_session_s=math.inf, max_pending_audio_s=math.inf,
        second_pass="none")
    results = transcribe_files(config, [c.path for c in clips], progress=False)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results


def reference_finals(model_dir: Path, clips: list[Clip], blocks_per_stream: int) -> list[
        list[str]]:
    """Each clip's final segments from ``transcribe_files``."""
    results = offline_results(model_dir, clips, blocks_per_stream)
    assert all(r.finish_reason == "stop" for r in results), [r.finish_reason for r in results]
    return [[s["text"] for s in r.segments] for r in results]


async def _receive_all(ws: ClientConnection, result: ClientResult) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            result.messages.append(json.loads(message))
            result.received_at.append(loop.time())


async def _send_frames(ws: ClientConnection, pcm: bytes, frame_bytes: int, realtime: bool,
                       vanish_after_s: float | None, result: ClientResult) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    for index, offset in enumerate(range(0, len(pcm), frame_bytes)):
        if vanish_after_s is not None and index * FRAME_S >= vanish_after_s:
            result.vanished = True
            return
        if realtime:
            await asyncio.sleep(max(0.0, began + index * FRAME_S - loop.time()))
        await ws.send(pcm[offset:offset + frame_bytes])


async def stream_clip(url: str, pcm: bytes, fmt: str = "s16le", realtime: bool = True,
                      vanish_after_s: float | None = None, vanish_by_reset: bool = True,
                      result: ClientResult | None = None) -> ClientResult:
    """Stream ``pcm`` (16 kHz, ``fmt``) in 100 ms frames, then ``end``; collect until closed.

    Args:
        url: the ``ws://host:port/ws/asr`` address.
        pcm: the audio bytes.
        realtime: pace frames at 100 ms; False sends them back to back.
        vanish_after_s: disappear after this much audio (no ``end``): by a TCP reset when
            ``vanish_by_reset``, else by a normal close frame.
        result: where to record what arrives (to watch it while the client runs).
    Returns:
        What the client received and how the connection closed (``result`` if given).
    """
    result = result if result is not None else ClientResult()
    frame_bytes = int(SAMPLE_RATE * FRAME_S) * (2 if fmt == "s16le" else 4)
    async with connect(url, max_size=2**22, open_timeout=30) as ws:
        receiver = asyncio.create_task(_receive_all(ws, result))
        start = {"type": "start", "sample_rate": SAMPLE_RATE, "format": fmt}
        with contextlib.suppress(ConnectionClosed):  # refused (busy): the receiver has why
            await ws.send(json.dumps(start))
            await _send_frames(ws, pcm, frame_bytes, realtime, vanish_after_s, result)
            if not result.vanished:
                await ws.send(json.dumps({"type": "end"}))
        if result.vanished:
            receiver.cancel()
            if vanish_by_reset:
                ws.transport.abort()
            else:
                await ws.close()
            return result
        await asyncio.wait_for(receiver, CLOSE_TIMEOUT_S)
    result.close_code = ws.close_code
    return result


def assert_clean_finish(result: ClientResult, expected_finals: list[str], what: str) -> None:
    """``stop``, close 1000, no error, and exactly the reference's segments."""
    assert not result.errors, f"{what}: errors {result.errors}"
    assert result.finish_reason == "stop", f"{what}: finished {result.finish_reason!r}"
    assert result.close_code == 1000, f"{what}: close code {result.close_code}"
    assert result.finals == expected_finals, (
        f"{what}: heard {result.finals!r}, the same model offline says {expected_finals!r}")


def assert_server_clean(server: Any) -> None:
    """Up, healthy, idle again (every block and slot free) and no traceback in its log."""
    assert server.is_running(), f"the server exited:\n{server.log_tail()}"
    assert server.is_healthy(), server.log_tail()
    server.wait_until_idle(timeout_s=30)
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in ASGI" not in log, server.log_tail(6000)
