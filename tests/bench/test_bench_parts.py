"""The benchmark's parts measure what they claim: same work both ways, exact bytes, honest
latency matching, and a real-time search that finds the boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oasr.benchmarks.drivers import DenseLoop, EngineDriver, bench_engine_config
from oasr.benchmarks.loadgen import ClientResult, _match, _Timeline
from oasr.benchmarks.memory import check_steady_state, kv_bytes
from oasr.benchmarks.runner import BenchConfig
from oasr.benchmarks.server_load import percentile
from oasr.benchmarks.throughput import RealtimeProbe, search_max_realtime
from oasr.benchmarks.workload import BenchModel, load_speech


@pytest.mark.parametrize("family_fixture", ["tiny", "tiny_whisper"])
def test_engine_and_dense_loop_decode_the_same_audio_to_the_same_text(
        family_fixture: str, audio_dir: Path, request: pytest.FixtureRequest) -> None:
    tiny: BenchModel = request.getfixturevalue(family_fixture)
    speech = load_speech(audio_dir, 3, 4.0)
    engine = EngineDriver(tiny, speech, bench_engine_config(3, 8, device="cpu", dtype="float32"))
    dense = DenseLoop(tiny, speech, device=torch.device("cpu"), dtype=torch.float32)
    assert engine.step() == 0.0  # the first step admits the streams; they run from the next
    engine_audio = sum(engine.step() for _ in range(5))
    dense_audio = sum(dense.step() for _ in range(5))
    assert engine_audio == pytest.approx(dense_audio) == pytest.approx(3 * 5 * 0.64)
    decoder, ctc = engine.resources.ctc.decoder, engine.resources.ctc
    engine_texts = [decoder.partial(ctc.get_state(i)).text for i in range(3)]
    assert engine_texts == [s.text for s in dense.streams]
    assert any(engine_texts)  # the random model says something, so equality is not vacuous


def test_both_ways_decode_as_the_server_does(audio_dir: Path) -> None:
    """The bundled model is benchmarked with oasr-server's decoding (beam 16, its char and
    word LMs fused) in the engine and in the dense loop alike, and both write the same
    text; a bench asked for greedy decodes greedy both ways."""
    from oasr.benchmarks.workload import load_bench_model

    served = load_bench_model(None)
    assert served.beam == 16 and served.decoding == {
        "beam": 16, "lms": "char + word", "search": "CTC prefix beam search",
        "tokens_per_frame": 16}
    speech = load_speech(audio_dir, 2, 4.0)
    engine = EngineDriver(served, speech, bench_engine_config(2, 7, device="cpu",
                                                               dtype="float32"))
    dense = DenseLoop(served, speech, device=torch.device("cpu"), dtype=torch.float32)
    for decoder in (engine.resources.ctc.decoder, dense.decoder):
        assert decoder.config.beam_size == 16 and decoder._fusion is not None
        assert decoder.config.top_k == 16
    engine.step()  # admits the streams
    for _ in range(5):
        engine.step()
        dense.step()
    ctc = engine.resources.ctc
    texts = [ctc.decoder.partial(ctc.get_state(i)).text for i in range(2)]
    assert texts == [s.text for s in dense.streams] and all(texts)
    greedy = load_bench_model(None, beam=1)
    assert greedy.decoding["search"] == "CTC greedy"
    engine = EngineDriver(greedy, speech[:1], bench_engine_config(1, 3, device="cpu"))
    dense = DenseLoop(greedy, speech[:1], device=torch.device("cpu"))
    for decoder in (engine.resources.ctc.decoder, dense.decoder):
        assert decoder.config.is_greedy and decoder._fusion is None


def test_throughput_in_bfloat16_runs_both_ways_in_bfloat16(tiny: BenchModel,
                                                          audio_dir: Path) -> None:
    from oasr.benchmarks.throughput import measure_throughput

    row = measure_throughput(tiny, audio_dir, 2, warmup=1, steps=1, device="cpu",
                             dtype="bfloat16")
    assert row.engine_rate > 0 and row.dense_rate > 0
    # both ways cast a copy: the shared model keeps its float32 weights for what follows
    assert next(tiny.model.parameters()).dtype == torch.float32


def test_bench_config_refuses_an_unknown_dtype() -> None:
    with pytest.raises(ValueError,
                       match="dtype must be one of auto, float32, float16, bfloat16, int8"):
        BenchConfig(dtype="int4")


def test_throughput_in_int8_quantizes_both_ways_on_copies(tiny_whisper: BenchModel,
                                                          audio_dir: Path) -> None:
    from oasr.models.int8 import count_int8_linears

    speech = load_speech(audio_dir, 2, 3.0)
    config = bench_engine_config(2, 6, device="cpu", dtype="int8")
    engine = EngineDriver(tiny_whisper, speech, config)
    dense = DenseLoop(tiny_whisper, speech, device=torch.device("cpu"), int8=True)
    quantized = count_int8_linears(engine.resources.model)
    assert quantized > 0 and count_int8_linears(dense.model) == quantized
    assert count_int8_linears(tiny_whisper.model) == 0
    engine.step()
    assert sum(engine.step() for _ in range(3)) == pytest.approx(sum(dense.step() for _ in range(3)))


def test_speech_streams_are_distinct_real_audio(audio_dir: Path) -> None:
    a, b = load_speech(audio_dir, 2, 3.0)
    assert len(a) == len(b) == 48000
    assert not torch.equal(torch.from_numpy(a), torch.from_numpy(b))
    assert float(abs(a).max()) > 0.01


def test_samples_for_frames_matches_the_67_frame_first_window(tiny: BenchModel) -> None:
    assert tiny.samples_for_frames(16) == 400 + 66 * 160
    assert tiny.samples_for_frames(32) - tiny.samples_for_frames(16) == 64 * 160


def test_kv_bytes_formula(tiny: BenchModel) -> None:
    kv = kv_bytes(tiny, num_left_chunks=4, device="cpu")
    cfg = tiny.config
    per_frame = 2 * cfg.num_blocks * cfg.output_size * 4  # heads * head_dim == output_size
    assert kv.bytes_per_frame == per_frame
    assert kv.bytes_per_block == kv.allocator_bytes_per_block == 16 * per_frame
    assert kv.bytes_per_stream_left == 5 * 16 * per_frame
    assert kv.history_seconds == 60.0
    assert kv.bytes_per_stream_history == 94 * 16 * per_frame  # ceil(1500 / 16) blocks


def test_steady_state_reuses_the_pool(tiny: BenchModel, audio_dir: Path) -> None:
    check = check_steady_state(tiny, audio_dir, num_streams=3, num_left_chunks=2, steps=2,
                               device="cpu")
    assert check.same_storage
    assert check.used_blocks == (6, 6)  # 3 streams x 2 retained blocks after eviction
    assert check.allocates_no_cache_tensors


def test_step_profile_splits_the_step_into_its_parts(tiny: BenchModel, audio_dir: Path) -> None:
    from oasr.benchmarks.profile import profile_engine_step

    profile = profile_engine_step(tiny, audio_dir, num_streams=2, warmup=1, steps=2,
                                  device="cpu")
    ms = profile.ms
    for part in ("features", "model_forward", "conv_stem", "attention", "paged_attention",
                 "decode"):
        assert ms[part] > 0, part  # every named function was found and ran in the step
    assert ms["conv_stem"] + ms["attention"] <= ms["model_forward"] <= ms["step"]
    assert ms["paged_attention"] <= ms["attention"]
    parts = ms["features"] + ms["model_forward"] + ms["decode"] + ms["rest"]
    assert parts == pytest.approx(ms["step"])
    assert ms["rest"] >= 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_op_profile_shares_the_step_among_its_ops(tiny_whisper: BenchModel, audio_dir: Path,
                                                  dtype: str) -> None:
    """The per-op profile lists the step's ops by share of its op time, and counts the matrix
    multiplies of whichever path the dtype takes (aten's on float32; oneDNN's fused linears
    on bfloat16 where the CPU multiplies it natively) as GEMMs."""
    from oasr.benchmarks.profile import ATTENTION_OPS, GEMM_OPS, profile_step_ops
    from oasr.models.fused_linear import fusable

    prof = profile_step_ops(tiny_whisper, audio_dir, num_streams=2, warmup=2, steps=2,
                            device="cpu", dtype=dtype)
    assert prof.dtype == dtype and prof.num_streams == 2 and prof.steps == 2
    names = [op.name for op in prof.ops]
    assert len(set(names)) == len(names)
    assert all(op.calls_per_step > 0 and op.ms_per_step >= 0 for op in prof.ops)
    assert sum(op.share for op in prof.ops) <= 1 + 1e-9
    listed_gemm = sum(op.share for op in prof.ops if op.name in GEMM_OPS)
    assert 0 < listed_gemm <= prof.gemm_share < 1
    listed_attention = sum(op.share for op in prof.ops if op.name in ATTENTION_OPS)
    assert listed_attention <= prof.attention_share and prof.gemm_share + prof.attention_share < 1
    assert prof.attention_share > 0  # the CPU's default backend: torch's fused attention
    fused = dtype == "bfloat16" and fusable(torch.zeros(1, dtype=torch.bfloat16))
    assert ("mkldnn::_linear_pointwise" if fused else "aten::addmm") in names
    # the weights were packed in the warm-up (the first forward), not in the profiled steps
    assert "mkldnn::_reorder_linear_weight" not in names


def test_partial_latency_matches_in_order_and_counts_strangers() -> None:
    timeline = _Timeline()
    timeline.marks = [(1600, 10.0), (3200, 10.1), (4800, 10.2)]
    expected = [("a", 1000), ("ab", 3000), ("abc", 4800)]
    result = ClientResult()
    cursor = _match(result, expected, 0, "ab", 10.35, timeline, 4800)
    assert cursor == 2 and result.partial_latencies == [pytest.approx(0.25)]
    cursor = _match(result, expected, cursor, "zz", 10.4, timeline, 4800)
    assert cursor == 2 and result.num_unmatched == 1
    cursor = _match(result, expected, cursor, "abc", 10.5, timeline, 4800)
    assert cursor == 3 and result.partial_latencies[-1] == pytest.approx(0.3)
    assert result.num_partials == 3


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.95) == 95.0
    assert percentile([3.0], 0.95) == 3.0


@pytest.mark.parametrize(("boundary", "estimate"), [(137, 100), (137, 400), (5, 1), (0, 10)])
def test_realtime_search_finds_the_boundary(boundary: int, estimate: int) -> None:
    seen: list[int] = []

    def probe(n: int) -> RealtimeProbe:
        seen.append(n)
        return RealtimeProbe(n, step_ms=640.0 * n / max(boundary, 0.5), chunk_ms=640.0)

    found, probes = search_max_realtime(probe, estimate, max_probes=20)
    assert found <= boundary
    assert found >= boundary - max(2, boundary // 20)
    assert [p.num_streams for p in probes] == seen


def test_bench_config_refuses_curves_without_the_headline_chunks() -> None:
    with pytest.raises(ValueError, match="10 and 200"):
        BenchConfig(checkpoints=(1, 50))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["conformer", "whisper_ctc"])
def test_server_load_runs_real_clients_against_a_real_server(audio_dir: Path,
                                                             family: str) -> None:
    from oasr.benchmarks.server_load import measure_server_load
    from oasr.benchmarks.workload import load_bench_model

    bench = load_bench_model(tiny=True, family=family)
    rows = measure_server_load(bench, audio_dir, [1, 2], seconds=2.0, threads=1)
    assert [r.num_clients for r in rows] == [1, 2]
    for row in rows:
        assert row.num_errors == 0, row.error_samples
        assert row.num_partials > 0 and row.num_unmatched == 0
        assert 0 < row.partial_p50_ms <= row.partial_p95_ms
        assert 0 < row.final_p50_ms <= row.final_p95_ms


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_server_load_decodes_as_the_bench_does(audio_dir: Path, tmp_path: Path) -> None:
    """The bundled model's server load runs a server with its LMs and beam: every partial the
    clients get is one the bench's own beam-16 run expected (a greedy server would not
    match them)."""
    from oasr.benchmarks.server_load import measure_server_load, save_bench_model
    from oasr.benchmarks.workload import load_bench_model, served_beam

    bench = load_bench_model(None)
    saved = Path(save_bench_model(bench, tmp_path / "model"))
    assert {f.name for f in saved.glob("*_lm.*")} >= {"char_lm.safetensors", "word_lm.json"}
    assert served_beam(saved) == bench.beam == 16
    (row,) = measure_server_load(bench, audio_dir, [1], seconds=3.0, threads=1)
    assert row.num_errors == 0, row.error_samples
    assert row.num_partials > 0 and row.num_unmatched == 0


def test_alternated_median_ms_takes_turns_and_times_each_call() -> None:
    from oasr.benchmarks.timing import alternated_median_ms

    order: list[str] = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    ms = alternated_median_ms(calls, 3)
    assert order == ["a", "b"] * 4  # one untimed round, then three timed ones, in turns
    assert set(ms) == {"a", "b"} and all(value >= 0 for value in ms.values())
