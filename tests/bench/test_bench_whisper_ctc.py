"""The Whisper-CTC benchmark paths measure the same work both ways: the one-stream dense
baseline equals the model's chunk-masked forward and the engine's paged forward, the FLOP
formula equals the counted FLOPs, and every part runs on a tiny Whisper-CTC model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from oasr.benchmarks.compute import EXTRA_FLOP_FORMULAS, whisper_ctc_flops
from oasr.benchmarks.dense import WhisperDense
from oasr.benchmarks.drivers import RunnerDriver, bench_engine_config
from oasr.benchmarks.history import history_checkpoints
from oasr.benchmarks.memory import check_steady_state, kv_bytes
from oasr.benchmarks.workload import BenchModel, load_bench_model, load_speech
from oasr.engine import EngineConfig


def _dense_log_probs(bench: BenchModel, feats: np.ndarray, num_chunks: int,
                     num_left_chunks: int) -> list[torch.Tensor]:
    dense = WhisperDense(bench.model, bench.chunk_size, num_left_chunks)
    cache = dense.empty_cache()
    out = []
    with torch.inference_mode():
        for k, window in enumerate(bench.windows(feats)[:num_chunks]):
            log_probs, cache = dense.forward(torch.from_numpy(window)[None],
                                             k * bench.chunk_size, cache)
            out.append(log_probs[0])  # (T', V)
    return out


@pytest.mark.parametrize("num_left_chunks", [-1, 2])
def test_dense_baseline_equals_the_chunk_masked_forward(tiny_whisper: BenchModel,
                                                        audio_dir: Path,
                                                        num_left_chunks: int) -> None:
    speech = load_speech(audio_dir, 1, 0.64 * 6)[0]
    feats = tiny_whisper.features(speech)[: 6 * 64]  # 6 full chunks of 64 log-mel frames
    chunks = _dense_log_probs(tiny_whisper, feats, 6, num_left_chunks)
    with torch.inference_mode():
        full, lengths = tiny_whisper.model(torch.from_numpy(feats)[None], torch.tensor([384]),
                                           chunk_frames=32, left_chunks=num_left_chunks)
    assert int(lengths[0]) == 192
    torch.testing.assert_close(torch.cat(chunks), full[0], atol=1e-4, rtol=1e-4)
    # the history matters: with a bounded window the late chunks differ from unlimited
    if num_left_chunks >= 0:
        unlimited = torch.cat(_dense_log_probs(tiny_whisper, feats, 6, -1))
        assert not torch.allclose(unlimited[128:], full[0, 128:], atol=1e-4)


def test_dense_baseline_equals_the_paged_runner(tiny_whisper: BenchModel,
                                                audio_dir: Path) -> None:
    speech = load_speech(audio_dir, 2, 0.64 * 5)
    feats = [tiny_whisper.features(s) for s in speech]
    driver = RunnerDriver(tiny_whisper, feats, bench_engine_config(2, 6, device="cpu", dtype="float32"))
    paged = []
    for _ in range(4):
        plan = driver.plan()
        driver.runner.prepare(plan)
        paged.append(driver.runner.forward(plan).log_probs)  # (2, 32, V)
        driver.runner.commit(plan)
        driver.num_chunks_done += 1
    for row in range(2):
        dense = _dense_log_probs(tiny_whisper, feats[row], 4, -1)
        for k in range(4):
            torch.testing.assert_close(paged[k][row], dense[k], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("history_chunks", [0, 3])
def test_flop_formula_equals_the_counted_forward(tiny_whisper: BenchModel, audio_dir: Path,
                                                 history_chunks: int) -> None:
    speech = load_speech(audio_dir, 2, 0.64 * (history_chunks + 2))
    feats = [tiny_whisper.features(s) for s in speech]
    driver = RunnerDriver(tiny_whisper, feats,
                          bench_engine_config(2, history_chunks + 2, device="cpu"))
    for _ in range(history_chunks):
        driver.advance()
    plan = driver.plan()
    driver.runner.prepare(plan)
    # the bench's counter: oneDNN's fused linears and the CPU flash attention included
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)
    with counter:
        driver.runner.forward(plan)
    per_stream = whisper_ctc_flops(tiny_whisper.config, 32, 32 * history_chunks)
    assert counter.get_total_flops() == 2 * per_stream


def test_flop_formula_of_the_bundled_architecture() -> None:
    from oasr.models.whisper_ctc import WhisperCtcConfig

    config = WhisperCtcConfig()
    assert whisper_ctc_flops(config, 32, 0) == (
        2 * 64 * 384 * 80 * 3 + 2 * 32 * 384 * 384 * 3
        + 4 * (24 * 32 * 384 ** 2 + 4 * 32 * 32 * 384) + 2 * 32 * 384 * 31)  # 31 units
    assert 0.52e9 < whisper_ctc_flops(config, 32, 128) < 0.53e9


def test_history_stops_at_the_position_limit() -> None:
    assert history_checkpoints((1, 10, 50, 100, 200), 46) == (1, 10, 28, 46)
    assert history_checkpoints((10, 200), 46) == (10, 46)
    assert history_checkpoints((1, 10, 50, 100, 200), None) == (1, 10, 50, 100, 200)


def test_kv_bytes_of_whisper_ctc(tiny_whisper: BenchModel) -> None:
    kv = kv_bytes(tiny_whisper, num_left_chunks=4, device="cpu")
    # the pool of dtype "auto": bfloat16 for Whisper-CTC on CPUs with native bf16
    dtype = EngineConfig().resolve_dtype(torch.device("cpu"), "whisper_ctc")
    assert kv.dtype == str(dtype).removeprefix("torch.")
    per_frame = 2 * 2 * 32 * dtype.itemsize  # K and V x layers x width x element
    assert kv.bytes_per_frame == per_frame
    assert kv.bytes_per_block == kv.allocator_bytes_per_block == 32 * per_frame
    assert kv.bytes_per_stream_left == 5 * 32 * per_frame
    assert kv.history_seconds == 30.0  # the position table ends at 1500 x 20 ms
    assert kv.bytes_per_stream_history == 47 * 32 * per_frame  # ceil(1500 / 32) blocks


def test_steady_state_reuses_the_pool_and_the_conv_tails(tiny_whisper: BenchModel,
                                                         audio_dir: Path) -> None:
    check = check_steady_state(tiny_whisper, audio_dir, num_streams=3, num_left_chunks=2,
                               steps=2, device="cpu")
    assert check.same_storage
    assert check.used_blocks == (6, 6)
    assert check.allocates_no_cache_tensors


def test_step_profile_finds_the_whisper_parts(tiny_whisper: BenchModel,
                                              audio_dir: Path) -> None:
    from oasr.benchmarks.profile import profile_engine_step

    profile = profile_engine_step(tiny_whisper, audio_dir, num_streams=2, warmup=1, steps=2,
                                  device="cpu")
    ms = profile.ms
    for part in ("features", "frontend", "model_forward", "conv_stem", "attention",
                 "paged_attention", "decode"):
        assert ms[part] > 0, part
    assert ms["frontend"] <= ms["features"]
    assert ms["conv_stem"] + ms["attention"] <= ms["model_forward"]
    assert ms["paged_attention"] <= ms["attention"]


def test_frontends_cost_both_extractors_on_the_same_audio(audio_dir: Path) -> None:
    from oasr.benchmarks.features import measure_frontends

    cost = measure_frontends(audio_dir, num_streams=2, num_chunks=3)
    assert cost.fbank_ms > 0 and cost.log_mel_ms > 0 and cost.log_mel_batched_ms > 0
    # 3 x 640 ms: fbank frames of 25 ms every 10 ms, log-mel frames complete at 160 i + 200
    assert cost.fbank_frames == 2 * ((3 * 10240 - 400) // 160 + 1)
    assert cost.log_mel_frames == 2 * ((3 * 10240 - 200) // 160 + 1)


def test_a_model_dir_of_another_family_is_refused(tmp_path: Path) -> None:
    from oasr.models import save_model

    conformer = load_bench_model(tiny=True, family="conformer")
    save_model(conformer.model, tmp_path / "m")
    with pytest.raises(ValueError, match="holds a conformer_ctc model, not --family whisper_ctc"):
        load_bench_model(str(tmp_path / "m"), family="whisper_ctc")


@pytest.mark.parametrize("dtype, want", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_compute_runs_the_forward_and_the_peak_in_the_asked_dtype(
        tiny_whisper: BenchModel, audio_dir: Path, monkeypatch: pytest.MonkeyPatch,
        dtype: str, want: torch.dtype) -> None:
    """``oasr bench --dtype X``'s fraction of peak compares X's forward with X's matmuls."""
    from oasr.benchmarks import compute

    peak_dtypes: list[torch.dtype] = []
    forward_dtypes: list[torch.dtype] = []
    monkeypatch.setattr(compute, "measure_matmul_peak",
                        lambda device, dtype, size, repeats: peak_dtypes.append(dtype) or 1.0)
    time_forward = RunnerDriver.time_forward

    def timed(self: RunnerDriver, plan: object) -> float:
        forward_dtypes.append(self.runner.dtype)
        return time_forward(self, plan)

    monkeypatch.setattr(RunnerDriver, "time_forward", timed)
    result = compute.measure_compute(tiny_whisper, audio_dir, 2, 1, 2, "cpu", dtype)
    assert set(peak_dtypes) == set(forward_dtypes) == {want}
    assert result.gflop_per_step > 0
