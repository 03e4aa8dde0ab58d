"""``oasr bench --quick --json`` runs end to end on a tiny model and reports its keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasr.cli import main

HEADLINE_KEYS = {"speedup_batched_vs_sequential", "max_realtime_streams",
                 "paged_cost_ratio_chunk200_vs_chunk10_left4", "gflops_fraction_of_peak"}


def test_quick_json_has_the_headline_keys(audio_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    markdown = tmp_path / "bench.md"
    code = main(["bench", "--quick", "--json", "--tiny-model", "--streams", "2",
                 "--realtime-probes", "1", "--threads", "1", "--audio-dir", str(audio_dir),
                 "--markdown", str(markdown)])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out)  # stdout holds exactly one JSON object
    headline = result["headline"]
    assert set(headline) >= HEADLINE_KEYS
    assert headline["speedup_batched_vs_sequential"] > 0
    assert headline["speedup_num_streams"] == 2
    assert isinstance(headline["max_realtime_streams"], int)
    assert headline["paged_cost_ratio_chunk200_vs_chunk10_left4"] > 0
    assert headline["gflops_fraction_of_peak"] > 0
    assert "tiny test model" in result["model_source"]
    # each throughput point decoded the same audio both ways: 2 streams x 2 chunks x 0.64 s
    row = result["throughput"][0]
    assert row["engine_rate"] > 0 and row["dense_rate"] > 0
    assert [c["checkpoints"] for c in result["history"]] == [[10, 200]]
    assert len(result["realtime_probes"]) == 1
    # the K/V formula agrees with a real pool, and steady-state steps reuse every cache tensor
    kv = result["kv_bytes"]
    assert kv["bytes_per_block"] == kv["allocator_bytes_per_block"]
    assert kv["bytes_per_block"] == 16 * kv["bytes_per_frame"]
    assert result["steady_state"]["allocates_no_cache_tensors"] is True
    assert "| streams |" in markdown.read_text()
