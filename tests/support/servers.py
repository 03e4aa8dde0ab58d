"""A real ``oasr-server`` process for the end-to-end, reliability and server tests.

`launch_server` runs the ``oasr-server`` command line (uvicorn, the engine thread, the page) in a
child process on 127.0.0.1 with ``--port 0`` and reads the port the server prints once it is
ready; `server_factory` starts any number of them and stops them all at its end (the
``start_server`` / ``start_module_server`` fixtures of ``tests/conftest.py`` are built on it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.paths import REPO_ROOT

SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 30.0
_READY_LINE = re.compile(r"oasr is ready: open http://127\.0\.0\.1:(\d+)/")
SERVER_MAIN = "import sys; from backend.cli import server_main; sys.exit(server_main())"


@dataclass
class ServerProcess:
    """One ``oasr-server`` child process listening on ``address`` (``127.0.0.1:port``)."""

    process: subprocess.Popen[bytes]
    address: str
    log_path: Path
    flags: tuple[str, ...] = field(default=())
    api_key: str | None = None  # sent as a Bearer token by get_json when the server has keys

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.address}/ws/asr"

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def is_running(self) -> bool:
        return self.process.poll() is None

    def get_json(self, path: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        request = urllib.request.Request(f"http://{self.address}{path}", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        """``GET /api/stats``: the engine snapshot plus the server's connection counts."""
        return self.get_json("/api/stats")

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/healthz", timeout=10) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def rss_bytes(self) -> int:
        """Resident memory of the server process (Linux ``/proc``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS in /proc/{self.process.pid}/status")

    def wait_until_idle(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait for every block free, no stream active or waiting, no connection open.

        Returns:
            The first snapshot that shows it. Raises AssertionError with the last snapshot
            when ``timeout_s`` passes first.
        """
        deadline = time.monotonic() + timeout_s
        stats: dict[str, Any] = {}
        while time.monotonic() < deadline:
            stats = self.stats()
            if self.is_idle(stats):
                return stats
            time.sleep(0.1)
        pool, streams = stats.get("pool", {}), stats.get("streams", {})
        raise AssertionError(
            f"server not idle after {timeout_s} s: {pool.get('num_free_blocks')} of "
            f"{pool.get('num_blocks')} blocks free, {streams.get('active')} active, "
            f"{streams.get('waiting')} waiting, server {stats.get('server')}")

    @staticmethod
    def is_idle(stats: dict[str, Any]) -> bool:
        """All blocks free, no stream active or waiting, no ``/ws/asr`` connection open."""
        pool, streams = stats["pool"], stats["streams"]
        return (pool["num_free_blocks"] == pool["num_blocks"] and pool["num_used_blocks"] == 0
                and streams["active"] == 0 and streams["waiting"] == 0
                and stats["server"]["connections"] == 0)

    def stop(self) -> int:
        """SIGINT (uvicorn's graceful shutdown), then SIGKILL if it hangs; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(SERVER_STOP_TIMEOUT_S)
        return self.process.returncode


def launch_server(model_dir: Path | None, flags: tuple[str, ...], log_path: Path) -> ServerProcess:
    """Start ``oasr-server --host 127.0.0.1 --port 0 --device cpu [--model DIR] FLAGS``."""
    command = [sys.executable, "-c", SERVER_MAIN, "--host", "127.0.0.1", "--port", "0",
               "--device", "cpu", *flags]
    if model_dir is not None:
        command += ["--model", str(model_dir)]
        if "--second-pass" not in flags:
            # a random model's transcripts are compared exactly with its own CTC output
            command += ["--second-pass", "none"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=REPO_ROOT)
    server = ServerProcess(process, "", log_path, flags)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = _READY_LINE.search(log_path.read_text(errors="replace"))
        if match:
            server.address = f"127.0.0.1:{match.group(1)}"
            return server
        if process.poll() is not None:
            raise RuntimeError(
                f"oasr-server exited with {process.returncode} before it was ready:\n"
                f"{server.log_tail()}")
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"oasr-server not ready within {SERVER_START_TIMEOUT_S} s:\n"
                       f"{server.log_tail()}")


StartServer = Callable[..., ServerProcess]


def server_factory(tmp_dir: Path) -> Iterator[StartServer]:
    """Yields ``start(model_dir, *flags)``, which launches a server logging into ``tmp_dir``;
    afterwards stops them all and fails if one of them had died."""
    servers: list[ServerProcess] = []

    def start(model_dir: Path | None, *flags: str) -> ServerProcess:
        log_path = tmp_dir / f"server{len(servers)}.log"
        server = launch_server(model_dir, tuple(flags), log_path)
        servers.append(server)
        return server

    yield start
    crashed = []
    for server in servers:
        if not server.is_running():
            crashed.append(f"exit {server.process.returncode}:\n{server.log_tail()}")
        server.stop()
    assert not crashed, "an oasr-server died during the tests: " + "\n".join(crashed)
