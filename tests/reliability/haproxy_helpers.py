"""A real HAProxy running ``deploy/haproxy/haproxy.cfg`` in front of loopback replicas.

The project's file is used as written except for what only a deployment knows: the bind
addresses (free loopback ports instead of :8080 / :8404) and the replicas (``server`` lines
for ``oasr-server`` processes on loopback ports instead of the compose DNS ``server-template``).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_config(replicas: dict[str, str], port: int, stats_port: int) -> str:
    """The project's config with loopback binds and one ``server`` per replica address."""
    text = HAPROXY_CFG.read_text()
    text, binds = re.subn(r"^(\s*)bind :8080$", rf"\1bind 127.0.0.1:{port}", text, flags=re.M)
    text, stats = re.subn(r"^(\s*)bind :8404$", rf"\1bind 127.0.0.1:{stats_port}", text,
                          flags=re.M)
    servers = "\n".join(f"    server {name} {address} check" for name, address in replicas.items())
    text, templates = re.subn(r"^\s*server-template .*$", servers, text, flags=re.M)
    assert (binds, stats, templates) == (1, 1, 1), "deploy/haproxy/haproxy.cfg changed shape"
    return text


@dataclass
class HaproxyProcess:
    process: subprocess.Popen[bytes]
    port: int
    stats_port: int
    log_path: Path

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/asr"

    def server_states(self) -> dict[str, str]:
        """Each replica's state as HAProxy sees it (UP, DOWN, ...), from the stats CSV."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/;csv",
                                    timeout=5) as response:
            rows = csv.DictReader(io.StringIO(response.read().decode().lstrip("# ")))
            return {row["svname"]: row["status"] for row in rows
                    if row["pxname"] == "oasr" and row["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_for_states(self, expected: dict[str, str], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()[-2000:]
            try:
                states = self.server_states()
            except OSError:  # URLError included: not listening yet
                time.sleep(0.05)
                continue
            if all(states.get(name, "").startswith(state) for name, state in expected.items()):
                return
            time.sleep(0.05)
        raise AssertionError(f"HAProxy states {states}, expected {expected}:\n"
                             f"{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def start_haproxy(replicas: dict[str, str], work_dir: Path) -> HaproxyProcess:
    assert HAPROXY is not None
    port, stats_port = free_port(), free_port()
    config = work_dir / "haproxy.cfg"
    config.write_text(loopback_config(replicas, port, stats_port))
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log_path = work_dir / "haproxy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log,
                                   stderr=subprocess.STDOUT)
    return HaproxyProcess(process, port, stats_port, log_path)
