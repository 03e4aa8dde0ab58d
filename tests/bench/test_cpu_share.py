"""oasr.benchmarks.cpu_share reads a process tree's CPU from /proc: a child that burns CPU is
found below its parent and counted, and a server is found by the arguments it was started with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oasr.benchmarks.cpu_share import cpu_shares, pid_with_args, tree_cpu_seconds

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

BURN = "import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"


def test_a_busy_child_is_counted_below_its_parent() -> None:
    before = tree_cpu_seconds(os.getpid())
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", BURN, "--port", "47213"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = tree_cpu_seconds(os.getpid())
            if after.get(child.pid, 0.0) >= 0.3:
                break
            time.sleep(0.1)
        assert os.getpid() in after and child.pid in after
        shares = cpu_shares(before, after, time.monotonic() - started)
        assert shares[child.pid] > 0  # started between the readings: counted from 0
        assert pid_with_args("--port", "47213") == child.pid
        assert pid_with_args("--port", "4721") is None  # whole arguments only
    finally:
        child.kill()
        child.wait()


def test_shares_need_time_between_the_readings() -> None:
    with pytest.raises(ValueError, match="wall_s must be > 0"):
        cpu_shares({}, {}, 0.0)
    assert cpu_shares({1: 2.0}, {1: 3.0, 2: 0.5}, 2.0) == {1: 0.5, 2: 0.25}
