"""A real HAProxy running ``deploy/haproxy/haproxy.cfg`` in front of loopback replicas.

The project's file is used as written except for what only a deployment knows: the bind
addresses (free loopback ports instead of :8080 / :8404) and the replicas (``server`` lines
for ``oasr-server`` processes on loopback ports instead of the compose DNS ``server-template``).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from oasr.benchmarks.haproxy import free_port, loopback_config

HAPROXY = shutil.which("haproxy")


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
