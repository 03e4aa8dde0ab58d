"""``python -m backend.prestop``: a Kubernetes preStop hook that drains the server.

Sends SIGTERM to the server (PID 1 in the container by default), which starts its drain
(`backend.drain`), then waits until the process is gone or ``--timeout`` passes. The kubelet
sends its own SIGTERM after the hook returns; a draining (or exited) server ignores it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

POLL_S = 0.5


def is_running(pid: int) -> bool:
    """Whether ``pid`` is alive (an exited process not yet reaped, a zombie, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backend.prestop", description=__doc__)
    parser.add_argument("--pid", type=int, default=1, help="the oasr-server process")
    parser.add_argument("--timeout", type=float, default=40.0,
                        help="seconds to wait for the drain to finish")
    args = parser.parse_args(argv)
    if not is_running(args.pid):
        return 0
    os.kill(args.pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while is_running(args.pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if is_running(args.pid):
        print(f"prestop: pid {args.pid} still running after {args.timeout:g} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
