"""The output projection's BLAS choice: the same logits either way, the faster one kept per
thread count and row bucket, torch wherever numpy cannot read the weight as it is."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_info
from whisper_devset import Recording

import oasr.cpu as cpu_facts
from oasr.engine import EngineConfig
from oasr.models.whisper import WhisperCheckpoint
from oasr.models.whisper.logits import MAX_BLAS_ROWS, RESCORED, LogitsProjection

VOCAB, WIDTH = 1000, 64


def vocabulary_major(weight: torch.Tensor) -> torch.Tensor:
    """(V, d) values stored as the transpose of a contiguous (d, V) matrix, as on CPU."""
    return weight.t().contiguous().t()


def timer_favouring(fast: str, ratio: float = 0.5):  # type: ignore[no-untyped-def]
    def timer(backend: str, fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        return ratio if backend == fast else 1.0
    return timer


def no_blas(self: LogitsProjection, h: torch.Tensor) -> torch.Tensor:
    raise AssertionError("numpy's BLAS used where it must not be")


@torch.inference_mode()
@pytest.mark.parametrize("rows", [1, 5, MAX_BLAS_ROWS])
def test_blas_gives_torchs_logits(rows: int) -> None:
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    h = torch.randn(rows, 1, WIDTH)
    logits = LogitsProjection(weight, "blas")(h)
    assert logits.shape == (rows, 1, VOCAB) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(h, weight), rtol=1e-5, atol=1e-4)


@torch.inference_mode()
def test_auto_keeps_the_faster_per_thread_count_and_bucket() -> None:
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    threads = torch.get_num_threads()
    fast_blas = LogitsProjection(weight, "auto", timer_favouring("blas"))
    fast_blas(torch.randn(5, 1, WIDTH))
    fast_blas(torch.randn(1, 1, WIDTH))
    assert fast_blas.choices == {(threads, 8): "blas", (threads, 1): "blas"}
    slow_blas = LogitsProjection(weight, "auto", timer_favouring("torch"))
    slow_blas(torch.randn(5, 1, WIDTH))
    assert slow_blas.choices == {(threads, 8): "torch"}
    barely = LogitsProjection(weight, "auto", timer_favouring("blas", ratio=0.95))
    barely(torch.randn(5, 1, WIDTH))
    assert barely.choices == {(threads, 8): "torch"}  # within the margin: torch, the default


@torch.inference_mode()
def test_a_chosen_torch_never_calls_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    projection = LogitsProjection(weight, "auto", timer_favouring("torch"))
    projection(torch.randn(5, 1, WIDTH))  # timed: both ran
    monkeypatch.setattr(LogitsProjection, "_blas", no_blas)
    h = torch.randn(5, 1, WIDTH)
    torch.testing.assert_close(projection(h), F.linear(h, weight))


@pytest.mark.parametrize("case", ["many rows", "row-major weight", "float64", "grad", "torch"])
def test_torch_where_blas_does_not_apply(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    h = torch.randn(MAX_BLAS_ROWS + 1 if case == "many rows" else 5, 1, WIDTH)
    backend = "torch" if case == "torch" else "blas"
    if case == "row-major weight":
        weight = weight.contiguous()  # numpy would need a copy of it on every step
    if case == "float64":
        weight, h = weight.double(), h.double()
    monkeypatch.setattr(LogitsProjection, "_blas", no_blas)
    projection = LogitsProjection(weight, backend)
    with torch.inference_mode(case != "grad"):
        logits = projection(h)
    torch.testing.assert_close(logits, F.linear(h, weight).float())


@torch.inference_mode()
def test_a_weight_stored_anew_is_read_anew() -> None:
    parameter = torch.nn.Parameter(vocabulary_major(torch.randn(VOCAB, WIDTH)), requires_grad=False)
    projection = LogitsProjection(parameter, "auto", timer_favouring("blas"))
    h = torch.randn(5, 1, WIDTH)
    projection(h)
    parameter.data = vocabulary_major(torch.randn(VOCAB, WIDTH))
    assert projection.choices == {(torch.get_num_threads(), 8): "blas"}
    torch.testing.assert_close(projection(h), F.linear(h, parameter), rtol=1e-5, atol=1e-4)
    parameter[3] *= 2.0  # in place: the numpy view shares the storage
    torch.testing.assert_close(projection(h), F.linear(h, parameter), rtol=1e-5, atol=1e-4)


@torch.inference_mode()
def test_numpys_blas_runs_on_one_thread_and_keeps_its_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    def pool_sizes() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = pool_sizes()
    during: list[list[int]] = []
    matmul = np.matmul

    def watched(*args):  # type: ignore[no-untyped-def]
        during.append(pool_sizes())
        return matmul(*args)

    monkeypatch.setattr(np, "matmul", watched)
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    LogitsProjection(weight, "blas")(torch.randn(5, 1, WIDTH))
    assert before and during == [[1] * len(before)]
    assert pool_sizes() == before


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        LogitsProjection(torch.zeros(4, 2), "mkl")


@torch.inference_mode()
def test_a_beam_final_is_the_same_through_either_blas(checkpoint: WhisperCheckpoint,
                                                      recordings: list[Recording]) -> None:
    from oasr.models.whisper.continuous import ContinuousWhisperDecoder

    decoder = ContinuousWhisperDecoder(checkpoint, EngineConfig().second_pass_decode)  # beam 5
    projection = checkpoint.model.decoder.logits
    texts = {}
    try:
        for backend in ("torch", "blas"):
            projection.backend = backend
            decoder.submit(0, recordings[0].waveform)
            done: list = []
            while not done:
                done = decoder.step()
            texts[backend] = done[0].text
    finally:
        projection.backend = "auto"
    assert texts["blas"] == texts["torch"] and len(texts["torch"].split()) >= 5


def test_prepare_times_the_row_counts_a_decoder_uses() -> None:
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    projection = LogitsProjection(weight, "auto", timer_favouring("blas"))
    projection.prepare((1, 5))
    assert projection.choices == {(torch.get_num_threads(), 1): "blas",
                                  (torch.get_num_threads(), 8): "blas"}
    fixed = LogitsProjection(weight, "torch", timer_favouring("blas"))
    fixed.prepare((1, 5))
    assert fixed.choices == {}


@pytest.fixture
def packs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The data pointers of the weights `pack_int8` packs, one per call, as it is called."""
    import oasr.models.whisper.logits as logits_module

    packed: list[int] = []
    pack = logits_module.pack_int8

    def counted(weight: torch.Tensor, *args: object) -> object | None:
        packed.append(weight.data_ptr())
        return pack(weight, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(logits_module, "pack_int8", counted)
    return packed


def peaked_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """Decoder states whose best tokens stand out (as a trained decoder's do): each row near
    one token's embedding, plus noise."""
    picks = torch.randint(0, weight.shape[0], (rows,))
    return (weight[picks] * 3.0 + 0.3 * torch.randn(rows, weight.shape[1])).unsqueeze(1)


@torch.inference_mode()
@pytest.mark.parametrize("layout", ["vocabulary-major", "row-major"])
@pytest.mark.parametrize("rows", [1, 5, 45])
def test_int8_gives_the_best_candidates_float32_logits(rows: int, layout: str) -> None:
    weight = torch.randn(VOCAB, WIDTH)
    if layout == "vocabulary-major":  # as load_whisper stores it on CPU
        weight = vocabulary_major(weight)
    h = peaked_rows(weight, rows)
    exact = F.linear(h, weight)
    logits = LogitsProjection(weight, "int8")(h)
    assert logits.shape == (rows, 1, VOCAB) and logits.dtype == torch.float32
    # the candidates a search ranks (a beam's 2 x 5, well inside the rescored 64; at the
    # 64th the int8 order may differ): the same tokens, float32 values
    best = exact.topk(RESCORED // 4, dim=-1)
    torch.testing.assert_close(logits.gather(-1, best.indices), best.values,
                               rtol=1e-5, atol=1e-4)
    # the rest are int8 products: near, and not float32's (a broken int8 path that kept the
    # float logits everywhere would pass the first check only)
    spread = (exact.amax(-1, keepdim=True) - exact.amin(-1, keepdim=True))
    error = (logits - exact).abs() / spread
    assert error.max() < 0.03 and error.mean() > 1e-5


@torch.inference_mode()
@pytest.mark.parametrize("backend", ["torch", "int8"])
@pytest.mark.parametrize("rows", [1, 30])
def test_top_log_probs_are_the_best_of_the_whole_softmax(rows: int, backend: str) -> None:
    """A beam step's candidates: the k likeliest tokens, best first, with their log-probs
    under the softmax over the whole vocabulary (the suppressed ids out), as ranking
    ``log_softmax`` of the same projection's logits gives them. For int8 they are float32
    values, and suppressed ids never take a rescored place (a broken path that chose the 64
    before suppressing would leave fewer than k rescored candidates here)."""
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    projection = LogitsProjection(weight, backend)
    h = peaked_rows(weight, rows)[:, 0]  # (N, d)
    # suppress most of each row's float32 best, so that fewer than k of the int8 best 64
    # would be left unsuppressed
    ranked = F.linear(h, weight).topk(RESCORED, dim=-1).indices
    suppressed = torch.unique(ranked[:, : RESCORED - 4])
    k = 10
    best, ids = projection.top_log_probs(h, suppressed, k)
    assert best.shape == ids.shape == (rows, k) and best.dtype == torch.float32
    assert not torch.isin(ids, suppressed).any()
    assert torch.all(best[:, :-1] >= best[:, 1:])  # best first
    exact = F.linear(h, weight)
    exact[:, suppressed] = float("-inf")
    expected, expected_ids = torch.log_softmax(exact, dim=-1).topk(k, dim=-1)
    assert torch.equal(ids, expected_ids)  # the float32 ranking
    if backend == "torch":
        torch.testing.assert_close(best, expected)
    else:  # float32 logits; the normaliser's tail (past the rescored 64) in int8
        torch.testing.assert_close(best, expected, rtol=0, atol=1e-3)


@torch.inference_mode()
@pytest.mark.parametrize("backend", ["torch", "int8"])
def test_top_log_probs_never_give_a_suppressed_token(backend: str) -> None:
    """With fewer tokens left than the int8 path rescores, the suppressed ones it ranks among
    its 64 keep their -inf: the k best are the tokens left, then -inf."""
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    h = peaked_rows(weight, 3)[:, 0]
    left = torch.tensor([3, 50, 400, 999])
    suppressed = torch.tensor([t for t in range(VOCAB) if t not in left.tolist()])
    best, ids = LogitsProjection(weight, backend).top_log_probs(h, suppressed, 10)
    assert torch.isfinite(best[:, :4]).all() and torch.isneginf(best[:, 4:]).all()
    assert all(set(row[:4]) == set(left.tolist()) for row in ids.tolist())


@torch.inference_mode()
def test_int8_packs_once_per_storage_and_falls_back_off_the_cpu_path(
        packs: list[int]) -> None:
    parameter = torch.nn.Parameter(vocabulary_major(torch.randn(VOCAB, WIDTH)),
                                   requires_grad=False)
    projection = LogitsProjection(parameter, "int8")
    projection.prepare((1, 5))  # packed before any decode
    h = peaked_rows(parameter, 5)
    projection(h)
    projection(h)
    assert len(packs) == 1
    parameter.data = vocabulary_major(torch.randn(VOCAB, WIDTH))  # stored anew: packed anew
    best = F.linear(h, parameter).topk(1, dim=-1).indices
    assert torch.equal(projection(h).topk(1, dim=-1).indices, best) and len(packs) == 2
    # a float64 weight is not int8's: float logits, nothing packed
    double = LogitsProjection(parameter.double(), "int8")
    torch.testing.assert_close(double(h.double()), F.linear(h.double(), parameter.double()).float())
    assert len(packs) == 2


@torch.inference_mode()
def test_int8_falls_back_to_float_where_torch_cannot_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    import oasr.models.whisper.logits as logits_module

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no quantized engine")

    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    h = torch.randn(5, 1, WIDTH)
    # one kernel that packs but cannot multiply: the other one is kept
    both = logits_module.INT8_KERNELS
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", refuse)
    assert logits_module.pack_int8(weight, candidates=both).kernel == "onednn"  # type: ignore[union-attr]
    monkeypatch.undo()
    monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", refuse)
    assert logits_module.pack_int8(weight, candidates=both).kernel == "fbgemm"  # type: ignore[union-attr]
    monkeypatch.setattr(torch, "quantize_per_channel", refuse)  # neither: float logits
    assert logits_module.pack_int8(weight, candidates=both) is None
    assert logits_module.pack_int8(weight) is None
    projection = LogitsProjection(weight, "int8", timer_favouring("torch"))
    torch.testing.assert_close(projection(h), F.linear(h, weight))


@torch.inference_mode()
def test_an_int8_kernel_that_multiplies_wrongly_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel whose products are off (here oneDNN's clipped, as an int8 path that saturates
    on some CPU would give them) is refused when packing, and the other kernel serves."""
    from oasr.models.whisper.logits import INT8_KERNELS, pack_int8

    product = torch.ops.onednn.qlinear_pointwise

    def saturating(*args: object) -> torch.Tensor:
        out = product(*args)
        return out.clamp(-0.1 * float(out.abs().max()), 0.1 * float(out.abs().max()))

    monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", saturating)
    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    packed = pack_int8(weight, timer_favouring("onednn"), INT8_KERNELS)
    assert packed is not None and packed.kernel == "fbgemm"


@torch.inference_mode()
@pytest.mark.parametrize("fast", ["onednn", "fbgemm"])
def test_int8_keeps_the_faster_kernel(fast: str) -> None:
    from oasr.models.whisper.logits import INT8_KERNELS, INT8_TIMED_ROWS, pack_int8

    timed: list[tuple[str, int]] = []

    def timer(kernel: str, fn) -> float:  # type: ignore[no-untyped-def]
        timed.append((kernel, int(fn().shape[0])))
        return 0.5 if kernel == fast else 1.0

    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    packed = pack_int8(weight, timer, INT8_KERNELS)
    assert packed is not None and packed.kernel == fast
    # both kernels, on a beam's rows and on a batch of beams
    assert {kernel for kernel, _ in timed} == {"onednn", "fbgemm"}
    assert {rows for _, rows in timed} == set(INT8_TIMED_ROWS)


@torch.inference_mode()
@pytest.mark.parametrize(("machine", "amx", "packed"), [
    ("x86_64", True, {"onednn", "fbgemm"}), ("x86_64", False, {"fbgemm"}),
    ("aarch64", False, {"onednn", "fbgemm"})])
def test_onednn_int8_is_not_packed_on_an_x86_cpu_without_amx(
        monkeypatch: pytest.MonkeyPatch, machine: str, amx: bool, packed: set[str]) -> None:
    """Where oneDNN's int8 product is a slow kernel (x86 without AMX: seconds for a beam's
    rows) it is neither packed nor timed: a second-pass process starts at once."""
    import oasr.models.whisper.logits as logits_module

    monkeypatch.setattr(cpu_facts.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert set(logits_module.int8_kernels()) == packed
    built: list[str] = []
    real = logits_module.Int8Weight

    def counted(weight: torch.Tensor, kernel: str) -> object:
        built.append(kernel)
        return real(weight, kernel)

    monkeypatch.setattr(logits_module, "Int8Weight", counted)
    chosen = logits_module.pack_int8(vocabulary_major(torch.randn(VOCAB, WIDTH)),
                                     timer_favouring("onednn"))
    assert set(built) == packed and chosen is not None
    assert chosen.kernel == ("onednn" if "onednn" in packed else "fbgemm")


@torch.inference_mode()
@pytest.mark.parametrize("kernel", ["onednn", "fbgemm"])
def test_each_int8_kernel_is_near_the_float_product(kernel: str) -> None:
    """Both kernels' logits within 3 % of each row's range of float32's; the oneDNN kernel
    quantizes each row by its own range, so a row's logits are the same beside any rows, and
    a quiet row beside loud ones keeps its resolution (fbgemm's rows share one range)."""
    from oasr.models.whisper.logits import Int8Weight

    weight = vocabulary_major(torch.randn(VOCAB, WIDTH))
    packed = Int8Weight(weight, kernel)
    rows = peaked_rows(weight, 6)[:, 0]
    rows[3] *= 0.01  # a quiet row
    exact = F.linear(rows, weight)
    logits = packed(rows.contiguous())
    spread = exact.amax(-1, keepdim=True) - exact.amin(-1, keepdim=True)
    error = (logits - exact).abs() / spread  # (6, V)
    assert error[[0, 1, 2, 4, 5]].max() < 0.03
    if kernel == "onednn":
        assert error[3].max() < 0.03
        alone = packed(rows[3:4].contiguous())
        assert torch.equal(alone[0], logits[3])


@torch.inference_mode()
@pytest.mark.parametrize("vocab", [51864, 1000, 40])
def test_top_indices_are_topks(vocab: int) -> None:
    """The two-pass top-k gives ``topk``'s values (and so a valid set of indices), whatever the
    vocabulary's size against the group, with -inf (suppressed) tokens and with many ties."""
    from oasr.models.whisper.logits import top_indices

    logits = torch.randn(7, vocab) * 3
    logits[:, ::3] = float("-inf")
    logits[5] = torch.randint(0, 4, (vocab,)).float()  # ties across groups
    for k in (1, 5, min(64, vocab)):
        ids = top_indices(logits, k)
        assert torch.equal(logits.gather(1, ids), logits.topk(k, dim=-1).values)
        assert all(len(set(row)) == k for row in ids.tolist())


def test_best_indices_are_argmaxs_with_ties_suppressed_tokens_and_nan() -> None:
    """A greedy step's pick is ``argmax``'s: the first of equal maxima, past -inf tokens, and
    a NaN's index where a row holds one; over rows and over (rows, steps)."""
    from oasr.models.whisper.logits import best_indices

    logits = torch.randn(6, 51864) * 3
    logits[:, ::2] = float("-inf")
    logits[1] = torch.randint(0, 3, (51864,)).float()  # many ties: the first one counts
    logits[2, [7, 40_001]] = 50.0
    logits[4, 123] = float("nan")
    assert logits.argmax(dim=-1)[2] == 7 and logits.argmax(dim=-1)[4] == 123
    assert torch.equal(best_indices(logits), logits.argmax(dim=-1))
    steps = logits.view(2, 3, -1)
    assert torch.equal(best_indices(steps), steps.argmax(dim=-1))


def test_the_decode_config_refuses_an_unknown_logits_backend() -> None:
    from oasr.models.whisper.transcriber import WhisperDecodeConfig

    with pytest.raises(ValueError, match="logits"):
        WhisperDecodeConfig(logits="fp4")


def test_second_pass_logits_option_reaches_the_finals_decode() -> None:
    import argparse

    from oasr.engine.options import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    default = engine_config_from_args(parser.parse_args(["--lm", "none"]))
    assert default.second_pass_decode.logits == "int8"  # the server's default on CPU
    assert default.second_pass_decode == EngineConfig().second_pass_decode  # CLI = library
    float32 = engine_config_from_args(parser.parse_args(["--lm", "none",
                                                         "--second-pass-logits", "auto"]))
    assert float32.second_pass_decode.logits == "auto"
    assert float32.second_pass_decode_config().logits == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--second-pass-logits", "fp4"])


@torch.inference_mode()
def test_a_decoder_serves_its_configs_logits(checkpoint: WhisperCheckpoint,
                                             recordings: list[Recording],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode config's backend is the one its decoder's steps use: int8 finals of a read
    recording go through the packed product, and read what float32 reads."""
    from dataclasses import replace

    from oasr.models.whisper.continuous import ContinuousWhisperDecoder

    projection = checkpoint.model.decoder.logits
    calls: list[int] = []
    int8_logits = LogitsProjection._int8_logits

    def counted(self: LogitsProjection, h: torch.Tensor, packed: object) -> torch.Tensor:
        calls.append(h.shape[0])
        return int8_logits(self, h, packed)

    monkeypatch.setattr(LogitsProjection, "_int8_logits", counted)
    texts = {}
    try:
        for backend in ("auto", "int8"):
            config = replace(EngineConfig().second_pass_decode, logits=backend)
            decoder = ContinuousWhisperDecoder(checkpoint, config)
            assert projection.backend == backend
            decoder.submit(0, recordings[0].waveform)
            done: list = []
            while not done:
                done = decoder.step()
            texts[backend] = done[0].text
            assert bool(calls) == (backend == "int8")
    finally:
        projection.backend = "auto"
    assert texts["int8"] == texts["auto"] and len(texts["auto"].split()) >= 5


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["continuous", "transcriber"])
def test_a_decoder_packs_int8_when_built(checkpoint: WhisperCheckpoint, kind: str,
                                          packs: list[int]) -> None:
    """Both Whisper decoders (the live server's and ``oasr transcribe``'s) pack the int8 weight
    when they are built, so that no decode waits for it."""
    from dataclasses import replace

    from oasr.models.whisper.continuous import ContinuousWhisperDecoder
    from oasr.models.whisper.transcriber import WhisperTranscriber

    projection = checkpoint.model.decoder.logits
    projection._int8_storage = projection._int8 = None  # as a process that never packed
    config = replace(EngineConfig().second_pass_decode, logits="int8")
    build = ContinuousWhisperDecoder if kind == "continuous" else WhisperTranscriber
    try:
        build(checkpoint, config)
        assert projection.backend == "int8" and packs == [projection.weight.data_ptr()]
        with pytest.raises(ValueError, match="logits backend"):
            projection.serve("fp4", 5)
    finally:
        projection.backend = "auto"
