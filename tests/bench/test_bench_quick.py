"""``oasr bench --quick --json`` runs end to end on a tiny model of each family and reports its
keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasr.cli import main

HEADLINE_KEYS = {"speedup_batched_vs_sequential", "max_realtime_streams",
                 "paged_cost_ratio_chunk200_vs_chunk10_left4",
                 "paged_cost_ratio_late_vs_chunk10_left4", "history_late_chunk",
                 "gflops_fraction_of_peak", "realtime_ceiling_streams",
                 "realtime_share_of_ceiling", "gemm_share"}


@pytest.mark.parametrize(("family", "family_id", "late", "chunk_frames", "second_pass"), [
    ("conformer", "conformer_ctc", 200, 16, "none"),
    ("whisper_ctc", "whisper_ctc", 46, 32, "whisper"),  # 1500 positions / 32 frames: 46 chunks
])
def test_quick_json_has_the_headline_keys(audio_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], family: str,
                                          family_id: str, late: int, chunk_frames: int,
                                          second_pass: str) -> None:
    markdown = tmp_path / "bench.md"
    code = main(["bench", "--quick", "--json", "--tiny-model", "--family", family,
                 "--streams", "2", "--realtime-probes", "1", "--threads", "1",
                 "--audio-dir", str(audio_dir), "--markdown", str(markdown),
                 "--second-pass", second_pass])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out)  # stdout holds exactly one JSON object
    assert result["family"] == family_id
    assert f"tiny {family_id} test model" in result["model_source"]
    # random weights have no LMs: the server's decoding of such a model is greedy
    assert result["decoding"] == {"beam": 1, "lms": "none", "search": "CTC greedy"}
    headline = result["headline"]
    assert set(headline) >= HEADLINE_KEYS
    assert headline["speedup_batched_vs_sequential"] > 0
    assert headline["speedup_num_streams"] == 2
    assert isinstance(headline["max_realtime_streams"], int)
    assert headline["history_late_chunk"] == late
    assert headline["paged_cost_ratio_late_vs_chunk10_left4"] > 0
    if late == 200:
        assert headline["paged_cost_ratio_chunk200_vs_chunk10_left4"] > 0
    else:  # a chunk 200 this model cannot reach is not reported as one
        assert headline["paged_cost_ratio_chunk200_vs_chunk10_left4"] is None
    assert headline["gflops_fraction_of_peak"] > 0
    row = result["throughput"][0]
    assert row["engine_rate"] > 0 and row["dense_rate"] > 0
    assert [c["checkpoints"] for c in result["history"]] == [[10, late]]
    assert len(result["realtime_probes"]) == 1
    # the K/V formula agrees with a real pool, and steady-state steps reuse every cache tensor
    kv = result["kv_bytes"]
    assert kv["bytes_per_block"] == kv["allocator_bytes_per_block"]
    assert kv["bytes_per_block"] == chunk_frames * kv["bytes_per_frame"]
    assert result["steady_state"]["allocates_no_cache_tensors"] is True
    # the per-op profile of the step: top ops by share, the matrix multiplies' share
    prof = result["profile"]
    assert prof["num_streams"] == 2 and prof["components"] is None  # --quick: no cProfile
    ops = prof["ops"]
    assert 0 < len(ops) <= 12 and all(set(op) >= {"name", "share"} for op in ops)
    shares = [op["share"] for op in ops]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert 0 < prof["gemm_share"] < 1 and headline["gemm_share"] == prof["gemm_share"]
    assert 0 <= prof["attention_share"] < 1 - prof["gemm_share"]
    assert 0 < prof["ops_ms"] <= prof["step_ms"] * 1.05  # op time is part of the wall time
    assert headline["realtime_ceiling_streams"] > 0
    assert headline["realtime_share_of_ceiling"] == pytest.approx(
        headline["max_realtime_streams"] / headline["realtime_ceiling_streams"])
    text = markdown.read_text()
    assert "| streams |" in text and f"chunk {late} / chunk 10" in text
    assert "by torch op" in text and f"`{ops[0]['name']}`" in text
    # the second pass as served (Whisper tiny.en, whatever the streaming model), unless off
    if second_pass == "none":
        assert "finals_burst" not in result and "Finals decoded together" not in text
    else:
        burst = result["finals_burst"]
        assert (burst["segments"], burst["segment_s"], burst["threads"]) == (8, 5.0, 1)
        assert burst["beam"]["seconds"] > 0 and burst["greedy"]["seconds"] > 0
        assert "Finals decoded together by the second pass" in text
        assert f"| beam 5 (an idle server) | {burst['beam']['seconds']:.3f} |" in text


def test_quick_runs_with_the_beam_asked_for(audio_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    markdown = tmp_path / "bench.md"
    code = main(["bench", "--quick", "--json", "--tiny-model", "--family", "whisper_ctc",
                 "--streams", "2", "--realtime-probes", "1", "--threads", "1", "--beam-size", "3",
                 "--audio-dir", str(audio_dir), "--markdown", str(markdown),
                 "--second-pass", "none"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["decoding"] == {"beam": 3, "lms": "none", "search": "CTC prefix beam search",
                                  "tokens_per_frame": 3, "compiled": True}  # on the CPU
    assert ("Decoding (engine and dense loop): CTC prefix beam search, beam 3 (3 tokens a "
            "frame), compiled") in markdown.read_text()
    assert main(["bench", "--quick", "--beam-size", "0"]) == 2  # said in a line, no traceback
    assert capsys.readouterr().err.strip() == "oasr bench: beam must be >= 1 (1 = greedy), got 0"
