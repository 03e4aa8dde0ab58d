"""The engine end to end with ``dtype="int8"`` (int8 encoder Linear layers), both families.

Per-row activation scales and exact int32 accumulation make each Int8Linear row independent of
which other streams share the batch; the float parts (attention over padded rows) are as
batch-dependent as in the float engine, to rounding. So batched streams give the text each
gives alone, like the float engine does. (Quantization can turn a rounding difference into a
one-step difference, so on long real speech a rare partial may differ: the server benchmark's
unmatched partials.)
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full, run_until_idle, transcribe_alone

import oasr.cpu as cpu_facts
from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.models.int8 import Int8Linear, count_int8_linears
from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, save_whisper_ctc


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = WhisperCtcModel(WhisperCtcConfig(width=32, heads=2, layers=2, chunk_frames=8))
    with torch.no_grad():
        model.positions.copy_(torch.randn_like(model.positions) * 0.5)
    return save_whisper_ctc(model.eval(), tmp_path_factory.mktemp("wctc_int8"),
                            dtype=torch.float32)


def _config(model_dir: Path) -> EngineConfig:
    return EngineConfig(model=str(model_dir), device="cpu", dtype="int8", max_batch_size=4,
                        max_num_blocks=256, max_wait_time_s=math.inf, endpoint=None)


@pytest.mark.parametrize("family", ["conformer_ctc", "whisper_ctc"])
def test_int8_engine_serves_batched_streams_like_each_alone(
        family: str, tiny_model_dir: Path, whisper_dir: Path, speech: list[np.ndarray]) -> None:
    config = _config(tiny_model_dir if family == "conformer_ctc" else whisper_dir)
    engine = ASREngine(config)
    model = engine.resources.model
    assert engine.resources.family.name == family
    assert count_int8_linears(model) > 0
    # the layers the family keeps in float stay float
    ctc_head = model.ctc.ctc_lo if family == "conformer_ctc" else model.ctc
    assert not isinstance(ctc_head, Int8Linear)
    assert engine.resources.cache_config.dtype == torch.float32
    audios = [a[: 16000 * 2] for a in speech]
    events = Collector()
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    for sid, audio in enumerate(audios, start=1):
        assert events.done(sid).finish_reason == "stop"
        assert events.finals(sid) == transcribe_alone(config, audio).finals(1)
    assert_pool_full(engine)


def test_int8_is_a_dtype_choice_with_float32_activations() -> None:
    config = EngineConfig(dtype="int8")
    cpu = torch.device("cpu")
    assert config.resolve_dtype(cpu) == torch.float32
    assert config.int8_linears
    assert not replace(config, dtype="float32").int8_linears
    with pytest.raises(ValueError, match="int8"):
        EngineConfig(dtype="int4")


def test_auto_dtype_is_bfloat16_only_for_whisper_ctc_on_native_bf16_cpus(
        whisper_dir: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    auto = EngineConfig()
    for native in (True, False):
        monkeypatch.setattr(cpu_facts, "has_native_bf16", lambda native=native: native)
        want = torch.bfloat16 if native else torch.float32
        assert auto.resolve_dtype(cpu, "whisper_ctc") == want
        assert auto.resolve_dtype(cpu, "conformer_ctc") == torch.float32
        assert auto.resolve_dtype(cpu) == torch.float32
        assert not auto.int8_linears
        assert replace(auto, dtype="float32").resolve_dtype(cpu, "whisper_ctc") == torch.float32
    assert auto.resolve_dtype(torch.device("cuda"), "whisper_ctc") == torch.float16
    monkeypatch.setattr(cpu_facts, "has_native_bf16", lambda: True)
    whisper = ASREngine(replace(_config(whisper_dir), dtype="auto")).resources
    assert whisper.cache_config.dtype == torch.bfloat16
    assert next(whisper.model.parameters()).dtype == torch.bfloat16
    conformer = ASREngine(replace(_config(tiny_model_dir), dtype="auto")).resources
    assert conformer.cache_config.dtype == torch.float32


def test_a_given_model_is_cast_and_quantized_on_a_copy(whisper_dir: Path) -> None:
    from oasr.engine.runner.streams import StreamResources
    from oasr.models import load_model

    model = load_model(str(whisper_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for dtype in ("bfloat16", "int8"):
        resources = StreamResources.build(replace(_config(whisper_dir), dtype=dtype), model)
        assert resources.model is not model
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert count_int8_linears(model) == 0


def test_a_dtype_this_cpu_has_no_instructions_for_is_named_at_start(
        whisper_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import oasr.engine.families.dtypes as dtypes_module

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    avx2 = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})  # a 2-vCPU AMD EPYC's kind
    vnni = avx2 | {"avx512f", "avx512_vnni"}  # an Intel Xeon's kind
    monkeypatch.setattr(cpu_facts.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_facts, "flags", lambda: avx2)
    int8 = dtypes_module.slow_dtype_reason("int8", cpu)
    assert int8 is not None and "avx512_vnni" in int8 and "--dtype float32" in int8
    bf16 = dtypes_module.slow_dtype_reason("bfloat16", cpu)
    assert bf16 is not None and "emulated" in bf16
    for name in ("auto", "float32"):
        assert dtypes_module.slow_dtype_reason(name, cpu) is None
    assert dtypes_module.slow_dtype_reason("int8", cuda) is None
    monkeypatch.setattr(cpu_facts, "flags", lambda: vnni)
    assert dtypes_module.slow_dtype_reason("int8", cpu) is None
    assert dtypes_module.slow_dtype_reason("bfloat16", cpu) is not None  # no avx512_bf16
    monkeypatch.setattr(cpu_facts, "flags", lambda: vnni | {"avx512_bf16"})
    assert dtypes_module.slow_dtype_reason("bfloat16", cpu) is None
    monkeypatch.setattr(cpu_facts, "flags", lambda: frozenset())  # unreadable
    assert dtypes_module.slow_dtype_reason("int8", cpu) is None
    # the engine says so in its log when it starts, and starts all the same
    monkeypatch.setattr(cpu_facts, "flags", lambda: avx2)
    with caplog.at_level(logging.WARNING, logger="oasr.engine.runner.streams"):
        ASREngine(replace(_config(whisper_dir), dtype="int8"))
    assert any("dtype int8" in r.getMessage() and "avx512_vnni" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oasr.engine.runner.streams"):
        ASREngine(replace(_config(whisper_dir), dtype="float32"))
    assert not [r for r in caplog.records if "dtype" in r.getMessage()]
