"""The decoder benchmark runs and reports every configuration it was asked for."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_decoder_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bench_decoder.py"),
        "--streams",
        "3",
        "--beams",
        "1",
        "4",
        "--vocab",
        "50",
        "--chunk",
        "4",
        "--chunks",
        "2",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--json",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=True)
    assert "decode_streams" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["beam"], r["call"]) for r in rows] == [
        (1, "decode_streams"),
        (1, "decode_chunk"),
        (4, "decode_streams"),
        (4, "decode_chunk"),
    ]
    assert all(r["frames_per_s"] > 0 for r in rows)
