"""Fixtures shared by the end-to-end and reliability suites: a real ``oasr-server`` process.

``start_server(model_dir, *flags)`` runs the ``oasr-server`` command line (uvicorn, the engine
thread, the page) in a child process on 127.0.0.1 with ``--port 0``, reads the port the server
prints once it is ready, and stops every server it started when the test (or module) ends.
``random_model_dir`` is a seeded random Conformer-CTC in oasr's format: its transcripts are
noise, but the same noise for the same audio, so exact comparisons work.
"""

from __future__ import annotations

import importlib.util
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

import pytest
import torch

from oasr.models import AsrModel, ConformerConfig, save_model

REPO_ROOT = Path(__file__).resolve().parents[1]
DEVSET_DIR = REPO_ROOT.parent / "shared" / "audio" / "devset"


def load_bench_script(name: str) -> Any:
    """``bench/<name>.py`` as a module (the scripts are not a package); registered under its
    name, as its dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
BUNDLED_MODEL_DIR = REPO_ROOT / "oasr" / "assets" / "default_model"
RANDOM_MODEL_UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "\u2581",
                      "<sos/eos>"]
SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 30.0
_READY_LINE = re.compile(r"oasr is ready: open http://127\.0\.0\.1:(\d+)/")
_SERVER_MAIN = "import sys; from backend.cli import server_main; sys.exit(server_main())"


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
    command = [sys.executable, "-c", _SERVER_MAIN, "--host", "127.0.0.1", "--port", "0",
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


def _server_factory(tmp_dir: Path) -> Iterator[StartServer]:
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


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start ``oasr-server`` processes for one test; all are stopped at its end."""
    yield from _server_factory(tmp_path)


@pytest.fixture(scope="module")
def start_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    """Like ``start_server``, but the servers live as long as the test module."""
    yield from _server_factory(tmp_path_factory.mktemp("servers"))


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random 2-block, 32-dim Conformer-CTC over characters, in oasr's format."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    config = ConformerConfig(vocab_size=len(RANDOM_MODEL_UNITS), output_size=32,
                             attention_heads=2, linear_units=64, num_blocks=2,
                             cnn_module_kernel=7)
    model = AsrModel(config, units=RANDOM_MODEL_UNITS).eval()
    torch.random.set_rng_state(generator_state)
    return save_model(model, tmp_path_factory.mktemp("random_model"))


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The trained default model's directory; skips the test when it is not there yet."""
    if not (BUNDLED_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"the bundled default model is missing ({BUNDLED_MODEL_DIR}/config.json): "
                    "accuracy checks need the trained model, a random one only checks mechanics")
    return BUNDLED_MODEL_DIR


@pytest.fixture(scope="session")
def devset_dir() -> Path:
    """The shared developer audio set (manifest.tsv, 16 kHz wavs, e2e/hello_48k.wav)."""
    if not (DEVSET_DIR / "manifest.tsv").is_file():
        pytest.skip(f"the shared audio set is missing ({DEVSET_DIR}/manifest.tsv)")
    return DEVSET_DIR
