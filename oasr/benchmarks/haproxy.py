"""The project's HAProxy config (``deploy/haproxy/haproxy.cfg``) run on loopback.

Used by the replica benchmark (``bench/bench_replicas.py``) and the HAProxy tests: the file is
run as written except for what only a deployment knows, the bind addresses and the replicas
(``server`` lines for loopback ``oasr-server`` processes instead of the compose DNS template).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HAPROXY_CFG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_config(replicas: dict[str, str], port: int, stats_port: int,
                    source: Path = HAPROXY_CFG) -> str:
    """``source`` with loopback binds and one ``server NAME ADDRESS check`` per replica.

    Raises:
        ValueError: the file no longer has exactly one of each line this replaces.
    """
    text = source.read_text()
    text, binds = re.subn(r"^(\s*)bind :8080$", rf"\1bind 127.0.0.1:{port}", text, flags=re.M)
    text, stats = re.subn(r"^(\s*)bind :8404$", rf"\1bind 127.0.0.1:{stats_port}", text,
                          flags=re.M)
    servers = "\n".join(f"    server {name} {address} check" for name, address in replicas.items())
    text, templates = re.subn(r"^\s*server-template .*$", servers, text, flags=re.M)
    if (binds, stats, templates) != (1, 1, 1):
        raise ValueError(f"{source} changed shape: expected one 'bind :8080', one "
                         "'bind :8404' and one server-template line")
    return text


@contextlib.contextmanager
def running_haproxy(replicas: dict[str, str], work_dir: Path,
                    timeout_s: float = 30.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """HAProxy in front of ``replicas`` (name -> host:port); yields (its host:port, process)
    once every replica passes its health check; stopped (by its pid) on exit."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise RuntimeError("haproxy is not installed (Debian package haproxy)")
    port, stats_port = free_port(), free_port()
    config = work_dir / "haproxy.cfg"
    config.write_text(loopback_config(replicas, port, stats_port))
    log_path = work_dir / "haproxy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not all_up(stats_port, len(replicas)):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not come up: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(10)


def all_up(stats_port: int, num_replicas: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/;csv", timeout=2) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return False
    rows = [line.split(",") for line in lines[1:]]
    return sum(1 for row in rows if len(row) > 17 and row[0] == "oasr"
               and row[1] not in ("FRONTEND", "BACKEND") and row[17] == "UP") == num_replicas
