"""bench/compiled_block.py runs each variant in a process of its own and prints one table row
per variant with a step time for each round."""

from __future__ import annotations

import subprocess
import sys

from support.paths import REPO_ROOT


def test_each_variant_gets_a_row_with_a_time_per_round() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "compiled_block.py"), "--streams", "2",
         "--steps", "1", "--num-left-chunks", "1", "--rounds", "2", "--threads", "1",
         "--variants", "fused", "plain"],
        check=True, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 2 |")]
    assert [row[1].strip() for row in rows] == ["fused", "plain"]
    for row in rows:
        times = [float(t) for t in row[2].split(",")]
        assert len(times) == 2 and all(t > 0 for t in times)
