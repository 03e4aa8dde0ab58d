"""The benchmark on an icefall Zipformer (slot runtime): the one-stream baseline does the
engine's work (same frames), and the quick run reports throughput and real-time streams."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.paths import ZIPFORMER_FIXTURE_DIR

from oasr.benchmarks.dense import ZipformerDense
from oasr.benchmarks.drivers import RunnerDriver, bench_engine_config
from oasr.benchmarks.report import format_markdown
from oasr.benchmarks.runner import BenchConfig, run_benchmarks
from oasr.benchmarks.workload import BenchModel, load_bench_model, load_speech


@pytest.fixture()
def zipformer() -> BenchModel:
    return load_bench_model(str(ZIPFORMER_FIXTURE_DIR))


def test_one_stream_baseline_equals_the_batched_slot_runner(zipformer: BenchModel,
                                                            audio_dir: Path) -> None:
    assert zipformer.family_name == "zipformer" and zipformer.chunk_size == 8
    speech = load_speech(audio_dir, 2, 0.32 * 5)
    feats = [zipformer.features(s) for s in speech]
    driver = RunnerDriver(zipformer, feats, bench_engine_config(2, 5, device="cpu", dtype="float32"))
    batched = []
    for _ in range(4):
        plan = driver.plan()
        output = driver.runner.forward(plan)
        driver.runner.commit(plan, output)  # the chunk's state becomes the streams'
        batched.append(output.log_probs)  # (2, 8, joiner_dim)
        driver.num_chunks_done += 1
    dense = ZipformerDense(zipformer.model)
    for row in range(2):
        cache = dense.empty_cache()
        with torch.inference_mode():
            for k, window in enumerate(zipformer.windows(feats[row])[:4]):
                frames, cache = dense.forward(torch.from_numpy(window)[None], 8 * k, cache)
                torch.testing.assert_close(batched[k][row], frames[0], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_quick_run_on_the_slot_runtime(audio_dir: Path) -> None:
    result = run_benchmarks(BenchConfig(quick=True, model=str(ZIPFORMER_FIXTURE_DIR),
                                        device="cpu", stream_counts=(4,), steps=1, warmup=1,
                                        realtime_probes=1, audio_dir=audio_dir,
                                        server_levels=(),  # as --quick: no server load
                                        second_pass=False))
    assert result["family"] == "zipformer"
    # the server's search for a model without a char LM: greedy, here the transducer's
    assert result["decoding"] == {"beam": 1, "lms": "none", "search": "transducer greedy"}
    headline = result["headline"]
    assert headline["speedup_batched_vs_sequential"] > 0 and headline["num_state_tensors"] == 38
    assert result["throughput"][0]["num_streams"] == 4 and len(result["realtime_probes"]) == 1
    assert "paged" in result["not_applicable"]
    tables = format_markdown(result)
    assert "one stream at a time" in tables and "slot state per stream" in tables
