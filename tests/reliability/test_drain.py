"""Graceful drain (#18) on a real ``oasr-server``: SIGTERM makes ``/readyz`` 503 at once,
refuses new sessions with ``draining`` (close 1013), lets live sessions finish with their
finals, ends the rest with ``timeout`` at ``--drain-timeout``, and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import ServerProcess, launch_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import ClientResult, Clip, assert_clean_finish, server_flags, stream_clip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Servers a test expects to exit by themselves; any still running are stopped."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        if server.is_running():
            server.process.kill()
            server.process.wait(30)


def readyz_status(server: ServerProcess) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.address}/readyz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


async def wait_for(predicate: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s} s"
        await asyncio.sleep(0.02)


async def refused_session(server: ServerProcess) -> ClientResult:
    result = ClientResult()
    async with connect(server.ws_url, open_timeout=30) as ws:
        with contextlib.suppress(ConnectionClosed):  # iteration raises on a close not 1000
            async for message in ws:
                result.messages.append(json.loads(message))
    result.close_code = ws.close_code
    return result


def test_sigterm_lets_live_sessions_finish_refuses_new_ones_and_exits_0(
        servers: list[ServerProcess], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]], tmp_path: Path) -> None:
    server = launch_server(random_model_dir, server_flags(2), tmp_path / "drain.log")
    servers.append(server)

    async def scenario() -> tuple[ClientResult, ClientResult, int]:
        live = ClientResult()
        task = asyncio.create_task(stream_clip(server.ws_url, clips[0].pcm(), result=live))
        await wait_for(lambda: live.got_ready, "the live stream ready")
        server.process.send_signal(signal.SIGTERM)
        began = time.monotonic()
        await wait_for(lambda: readyz_status(server) == 503, "readyz 503", 2.0)
        ready_after = time.monotonic() - began
        refused = await refused_session(server)
        await task
        assert ready_after < 1.0, f"/readyz took {ready_after:.2f} s to turn 503"
        return live, refused, readyz_status(server)

    live, refused, _ = asyncio.run(scenario())
    assert_clean_finish(live, references[0], "the session live at SIGTERM")
    assert [m["code"] for m in refused.errors] == ["draining"] and refused.close_code == 1013
    assert server.process.wait(30) == 0, server.log_tail()
    log = server.log_path.read_text()
    assert "Traceback" not in log and "draining for up to 30 s" in log


def test_at_the_drain_deadline_live_streams_end_with_timeout_and_their_final(
        servers: list[ServerProcess], random_model_dir: Path, clips: list[Clip],
        tmp_path: Path) -> None:
    server = launch_server(random_model_dir, (*server_flags(2), "--drain-timeout", "1"),
                           tmp_path / "deadline.log")
    servers.append(server)

    async def scenario() -> ClientResult:
        live = ClientResult()
        long_pcm = b"".join(c.pcm() for c in clips[:3])  # 9 s at real time: outlives the drain
        task = asyncio.create_task(stream_clip(server.ws_url, long_pcm, result=live))
        await wait_for(lambda: any(m["type"] == "partial" for m in live.messages),
                       "a first partial")
        server.process.send_signal(signal.SIGTERM)
        return await task

    began = time.monotonic()
    live = asyncio.run(scenario())
    assert live.finish_reason == "timeout", live.messages
    assert "drain timeout" in live.messages[-1]["message"]
    assert live.finals and live.close_code == 1000 and not live.errors
    assert live.messages[-2]["type"] == "final" and live.messages[-2]["reason"] == "timeout"
    assert time.monotonic() - began < 8
    assert server.process.wait(30) == 0, server.log_tail()
    assert "Traceback" not in server.log_path.read_text()
