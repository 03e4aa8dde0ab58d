"""A server that cannot be wedged (#19 part 2): each hostile probe, reproduced on loopback
against a real ``oasr-server``, ends with the server healthy, its pool full again, the engine
stepping and a good client transcribing exactly what the same model says offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from support.servers import SERVER_MAIN
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import (
    ClientResult,
    Clip,
    assert_clean_finish,
    offline_results,
    server_flags,
    stream_clip,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def good_client_transcribes(server: Any, clip: Clip, reference: list[str]) -> None:
    result = asyncio.run(stream_clip(server.ws_url, clip.pcm(), realtime=False))
    assert_clean_finish(result, reference, "the good client after the probe")


@pytest.mark.parametrize(("flags", "message"), [
    (("--num-left-chunks", "4", "--max-num-blocks", "8"), "raise max_num_blocks to 320"),
    (("--num-left-chunks", "-1", "--max-num-blocks", "70"), "each stream could hold only 1 block"),
    (("--chunk-size", "1"), "chunk_size 1 is below 4"),
    (("--lm-weight", "nan"), "lm_weight must be a finite number"),
    (("--idle-timeout", "nan"), "idle_timeout_s=nan"),
    (("--drain-timeout", "-1"), "drain_timeout_s=-1"),
])
def test_nonsense_settings_are_refused_at_startup(random_model_dir: Path, flags: tuple[str, ...],
                                                  message: str) -> None:
    command = [sys.executable, "-c", SERVER_MAIN, "--host", "127.0.0.1", "--port", "0",
               "--device", "cpu", "--second-pass", "none", "--model", str(random_model_dir),
               *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_help_shows_every_default() -> None:
    done = subprocess.run([sys.executable, "-c", SERVER_MAIN, "--help-all"],
                          capture_output=True, text=True, timeout=60)
    # each option's entry: from its line (two spaces in) to the next option's
    entries = re.split(r"\n  (?=--[a-z])", done.stdout.split("options:")[1])
    helps = {entry.split()[0]: " ".join(entry.split()) for entry in entries if entry.strip()}
    for flag, default in (("--drain-timeout", 30.0), ("--max-socket-audio", 5.0),
                          ("--max-batch-size", 64), ("--max-decode-slots", 16),
                          ("--min-audio-rate", 0.1), ("--header-timeout", 10.0),
                          ("--max-connections", 64)):
        shown = re.search(r"\(default: ([^)]+)\)", helps[flag])
        assert shown is not None and float(shown.group(1)) == default, helps[flag]
    # a default resolved from others: named, not a number (argparse may wrap at a hyphen)
    backlog = helps["--second-pass-max-backlog"].replace("- ", "-")
    assert "(default: --max-decode-slots per second-pass process)" in backlog, backlog
    undocumented = [flag for flag, text in helps.items()
                    if flag.startswith("--") and "default" not in text
                    and flag not in ("--help", "--help-all")
                    and flag != "--allowed-origin"]
    assert not undocumented, undocumented


_FAULTY_SERVER = """
import sys
from oasr.engine.engine import ASREngine
step = ASREngine.step
def faulty_step(self):  # a client's stream (ids from 1; start-up calibration's are negative)
    if any(r.num_frames_decoded for s, r in self.requests.items() if s > 0):
        raise RuntimeError("injected engine fault")
    return step(self)
ASREngine.step = faulty_step
from backend.cli import server_main
sys.exit(server_main())
"""


def test_engine_death_errors_every_client_and_exits_nonzero(
        random_model_dir: Path, clips: list[Clip], tmp_path: Path) -> None:
    command = [sys.executable, "-c", _FAULTY_SERVER, "--host", "127.0.0.1", "--port", "0",
               "--device", "cpu", "--model", str(random_model_dir),
               *server_flags(4, max_wait_s=30.0)]
    log_path = tmp_path / "faulty.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "oasr is ready: open http://127.0.0.1:" not in log_path.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        port = log_path.read_text().split("oasr is ready: open http://127.0.0.1:")[1].split("/")[0]
        url = f"ws://127.0.0.1:{port}/ws/asr"

        async def three() -> list[ClientResult]:
            return list(await asyncio.gather(*(stream_clip(url, c.pcm()) for c in clips[:3])))

        results = asyncio.run(three())
        assert process.wait(30) == 1, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    for result in results:
        assert result.errors and result.errors[0]["code"] == "internal", result.messages
        assert result.finish_reason == "error" and result.close_code == 1011
    assert "exiting with status 1" in log_path.read_text()


def test_a_stream_feeding_under_10_percent_of_real_time_loses_its_slot(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    server = checked_server(random_model_dir, *server_flags(
        2, extra=("--min-audio-rate", "0.1", "--audio-rate-window", "2")))

    async def trickle() -> ClientResult:  # 2 bytes (one sample) every 0.5 s
        result = ClientResult()
        async with connect(server.ws_url, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "start"}))
            try:
                while True:
                    await ws.send(b"\x01\x00")
                    with contextlib.suppress(asyncio.TimeoutError):
                        result.messages.append(json.loads(await asyncio.wait_for(ws.recv(), 0.5)))
            except ConnectionClosed:
                pass
            # a send can find the connection closed before the last messages were read
            # (``done`` and the close arriving between a read's timeout and the next send)
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    result.messages.append(json.loads(message))
        result.close_code = ws.close_code
        return result

    async def both() -> list[ClientResult]:
        return list(await asyncio.wait_for(asyncio.gather(trickle(), trickle()), 30))

    began = time.monotonic()
    for result in asyncio.run(both()):
        assert result.finish_reason == "timeout", result.messages
        done = result.messages[-1]
        assert "under 10% of real time" in done["message"], done
    assert time.monotonic() - began < 15  # not the 1-hour session limit, not the idle timeout
    server.wait_until_idle()
    good_client_transcribes(server, clips[0], references[0])


def concatenated_clip(clips: list[Clip], path: Path) -> Clip:
    samples = np.concatenate([c.samples for c in clips])
    soundfile.write(str(path), samples, 16000, subtype="PCM_16")
    return Clip(path, samples)


def test_flooding_clients_are_paced_by_backpressure_and_lose_nothing(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]], tmp_path: Path) -> None:
    server = checked_server(random_model_dir, *server_flags(
        4, extra=("--max-socket-audio", "2", "--max-queued-audio", "4")))
    floods = [concatenated_clip(clips[3 * i + 1:3 * i + 4], tmp_path / f"flood{i}.wav")
              for i in range(3)]  # 9 s each, sent as 4 s frames as fast as TCP allows
    expected = offline_results(random_model_dir, floods, 16)
    peak = {"queued": 0.0, "pauses": 0}

    async def flood(clip: Clip) -> ClientResult:
        result = ClientResult()
        pcm = clip.pcm()
        async with connect(server.ws_url, open_timeout=30, max_size=2**22) as ws:
            receiver = asyncio.create_task(_collect(ws, result))
            await ws.send(json.dumps({"type": "start"}))
            for offset in range(0, len(pcm), 128_000):
                await ws.send(pcm[offset:offset + 128_000])
            await ws.send(json.dumps({"type": "end"}))
            await asyncio.wait_for(receiver, 60)
        result.close_code = ws.close_code
        return result

    async def watch(tasks: list[asyncio.Task[ClientResult]]) -> None:
        while not all(t.done() for t in tasks):
            stats = (await asyncio.to_thread(server.stats))["server"]
            peak["queued"] = max(peak["queued"], stats["queued_audio_s"])
            peak["pauses"] = stats["num_flow_pauses"]
            await asyncio.sleep(0.05)

    async def scenario() -> list[ClientResult]:
        tasks = [asyncio.create_task(flood(c)) for c in floods]
        tasks.append(asyncio.create_task(stream_clip(server.ws_url, clips[0].pcm())))
        await watch(tasks)
        return [t.result() for t in tasks]

    *flooders, good = asyncio.run(scenario())
    assert_clean_finish(good, references[0], "the real-time client among the floods")
    for result, reference in zip(flooders, expected, strict=True):
        assert_clean_finish(result, [s["text"] for s in reference.segments], "a flooder")
    assert peak["pauses"] >= 3, peak  # every flooder was made to wait
    # each socket stops being read above 2 s queued; one 4 s frame may be in flight each
    assert peak["queued"] <= 3 * (2 + 4) + 1, peak
    server.wait_until_idle()
    good_client_transcribes(server, clips[1], references[1])


async def _collect(ws: Any, result: ClientResult) -> None:
    try:
        async for message in ws:
            result.messages.append(json.loads(message))
    except ConnectionClosed:
        pass


def test_deeply_nested_json_gets_an_error_not_a_traceback(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    server = checked_server(random_model_dir, *server_flags(2))

    async def nested() -> ClientResult:
        result = ClientResult()
        async with connect(server.ws_url, open_timeout=30) as ws:
            await ws.send("[" * 2000 + "]" * 2000)
            await _collect(ws, result)
        result.close_code = ws.close_code
        return result

    result = asyncio.run(nested())
    assert result.errors[0]["code"] == "bad_request" and result.close_code == 1008
    good_client_transcribes(server, clips[0], references[0])  # log checked by checked_server


def _stalled_viewer_socket(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills within a few snapshots
    sock.connect((host, int(port)))
    return sock


def test_stats_viewers_that_never_read_are_dropped(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    # 4,096 blocks: ~20 KB snapshots, 100 a second, fill the kernel's socket buffers (up to
    # 4 MB on loopback) in seconds; then the server's sends block
    server = checked_server(random_model_dir, *server_flags(2, blocks_per_stream=2048, extra=(
        "--max-connections", "2", "--stats-interval", "0.01", "--stats-send-timeout", "1")))
    url = f"ws://{server.address}/ws/stats"

    async def scenario() -> dict[str, Any]:
        stalled = [await connect(url, sock=_stalled_viewer_socket(server.address), max_queue=1,
                                 ping_interval=None, compression=None, open_timeout=30)
                   for _ in range(2)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (await asyncio.to_thread(server.stats))["server"]["stats_viewers"] > 0:
            assert loop.time() < deadline, "stalled viewers still hold their places"
            await asyncio.sleep(0.2)
        async with connect(url, open_timeout=30) as viewer:  # a place is free again
            snapshot = json.loads(await asyncio.wait_for(viewer.recv(), 10))
        for ws in stalled:
            ws.transport.abort()
        return snapshot

    snapshot = asyncio.run(scenario())
    assert "pool" in snapshot
    assert "dropped a /ws/stats viewer" in server.log_path.read_text()
    good_client_transcribes(server, clips[0], references[0])


def test_half_open_http_requests_are_closed_by_the_header_timeout(
        checked_server: Callable[..., Any], random_model_dir: Path, clips: list[Clip],
        references: list[list[str]]) -> None:
    server = checked_server(random_model_dir, *server_flags(2, extra=("--header-timeout", "1")))
    host, port = server.address.split(":")
    sockets = []
    for _ in range(100):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        sockets.append(sock)
    began = time.monotonic()
    for sock in sockets:
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1024) == b""  # closed by the server
        sock.close()
    assert time.monotonic() - began < 5
    good_client_transcribes(server, clips[0], references[0])
