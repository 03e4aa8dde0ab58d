"""A live server whose Whisper processes die one by one (``kill -9``): with one left it still
publishes Whisper's finals and reports one decoder; with none its finals are the CTC text; no
stream errors and the server never stops serving."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import soundfile
from support.servers import ServerProcess, StartServer
from ws_clients import ClientResult, stream_clip

from oasr.text.wer import normalize_transcript, word_error_rate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JFK = "and so my fellow americans ask not what your country can do for you ask what you can " \
      "do for your country"


def second_pass_processes(server_pid: int) -> list[int]:
    """The server's Whisper processes: its children started by multiprocessing's spawn (its
    resource tracker is a child too, started otherwise)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        if ppid == server_pid and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return sorted(found)


def wait_for_decoders(server: ServerProcess, expected: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = server.stats()["second_pass"]["num_decoders"]
        if seen == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"num_decoders {seen}, expected {expected}:\n{server.log_tail()}")


def finals(result: ClientResult) -> list[dict[str, Any]]:
    return [m for m in result.messages if m["type"] == "final"]


def test_whisper_processes_dying_one_by_one(start_server: StartServer, bundled_model_dir: Path,
                                            devset_dir: Path) -> None:
    server = start_server(None, "--max-batch-size", "2", "--second-pass-processes", "2")
    audio, rate = soundfile.read(str(devset_dir / "real_jfk.wav"), dtype="int16")
    assert rate == 16000
    pcm = audio.astype("<i2").tobytes()
    wait_for_decoders(server, 2)
    first, second = second_pass_processes(server.process.pid)

    os.kill(first, signal.SIGKILL)
    wait_for_decoders(server, 1)
    one_left = asyncio.run(stream_clip(server.ws_url, pcm, realtime=False))
    assert one_left.finish_reason == "stop" and not one_left.errors
    assert {m["source"] for m in finals(one_left)} == {"whisper"}
    text = " ".join(m["text"] for m in finals(one_left))
    assert word_error_rate(JFK, normalize_transcript(text)) <= 0.1, text

    os.kill(second, signal.SIGKILL)
    wait_for_decoders(server, 0)
    none_left = asyncio.run(stream_clip(server.ws_url, pcm, realtime=False))
    assert none_left.finish_reason == "stop" and not none_left.errors
    assert finals(none_left) and {m["source"] for m in finals(none_left)} == {"ctc"}

    assert server.is_healthy()
    log = server.log_path.read_text()
    assert "a second-pass process was lost; 1 go on" in log
    assert "second pass lost" in log and "Traceback" not in log
