"""ASREngine serving a Whisper-CTC model: the same guarantees as the Conformer's.

A tiny random Whisper-CTC (its transcripts are noise, but the same noise for the same audio)
through the real engine: batched == one stream at a time (log-probs and text), pool and state
slots back to full after finish and abort, and a stream reset at the position limit whose
segments each equal the full forward on that segment's features (positions from 0, conv state
zeroed, attention history dropped) with no frame lost.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full, run_until_idle, stream_all
from support.log_mel_calls import count_log_mel_batches

from oasr.engine import ASREngine, EngineConfig, Final
from oasr.engine.commands import AbortStream, AppendAudio, EndStream, OpenStream
from oasr.engine.events import Error
from oasr.engine.families import WhisperCtcFamily
from oasr.engine.runner.model_runner import BatchPlan, StepOutput
from oasr.models import fused_linear, load_model
from oasr.models.whisper_ctc import (
    WhisperCtcConfig,
    WhisperCtcModel,
    save_whisper_ctc,
)

CHUNK = 8  # encoder frames per chunk (160 ms): many chunks from short audio


def _save_tiny(out: Path, max_positions: int, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = WhisperCtcConfig(width=32, heads=2, layers=2, max_positions=max_positions,
                              chunk_frames=CHUNK)
    model = WhisperCtcModel(config)
    with torch.no_grad():
        model.positions.copy_(torch.randn_like(model.positions) * 0.5)
    return save_whisper_ctc(model.eval(), out, dtype=torch.float32)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("wctc"), max_positions=1500)


@pytest.fixture(scope="module")
def short_positions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Positions for 3 chunks: every stream is reset every 3 chunks (0.48 s)."""
    return _save_tiny(tmp_path_factory.mktemp("wctc_short"), max_positions=3 * CHUNK)


def _config(model_dir: Path, **overrides: object) -> EngineConfig:
    # float32: these compare log-probs to 1e-4 ("auto" is bfloat16 on CPUs with native bf16)
    config = EngineConfig(model=str(model_dir), device="cpu", dtype="float32", max_batch_size=4,
                          max_num_blocks=256,
                          max_wait_time_s=math.inf, endpoint=None)
    return replace(config, **overrides)  # type: ignore[arg-type]


class Recorder:
    """Wraps the runner's forward: each stream's windows and log-probs, and batch sizes."""

    def __init__(self, engine: ASREngine) -> None:
        self.feats: dict[int, list[np.ndarray]] = defaultdict(list)
        self.log_probs: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.batch_sizes: list[int] = []
        self._forward = engine.resources.runner.forward
        engine.resources.runner.forward = self.forward  # type: ignore[method-assign]

    def forward(self, plan: BatchPlan) -> StepOutput:
        out = self._forward(plan)
        self.batch_sizes.append(len(plan.stream_ids))
        for row, (sid, window) in enumerate(zip(plan.stream_ids, plan.windows, strict=True)):
            self.feats[sid].append(window.feats)
            self.log_probs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out

    def stream_log_probs(self, sid: int) -> torch.Tensor:
        return torch.cat(self.log_probs[sid])


def _run_alone(config: EngineConfig, audio: np.ndarray) -> tuple[ASREngine, Collector, Recorder]:
    """One stream, whole audio then end, through an engine with one slot, run until idle."""
    engine = ASREngine(replace(config, max_batch_size=1))
    recorder = Recorder(engine)
    events = stream_all(engine, audio)
    run_until_idle(engine)
    return engine, events, recorder


def test_load_model_picks_the_family(whisper_dir: Path) -> None:
    model = load_model(whisper_dir)
    assert isinstance(model, WhisperCtcModel)
    engine = ASREngine(_config(whisper_dir))
    family = engine.resources.family
    assert isinstance(family, WhisperCtcFamily)
    assert engine.resources.chunk_size == CHUNK  # the model's trained chunk
    assert engine.resources.cache_config.num_layers == 2
    assert (engine.resources.cache_config.n_kv_head, engine.resources.cache_config.head_dim) == (2, 16)
    assert sorted(engine.resources.states.specs) == ["conv1", "conv2"]
    assert engine.latest_stats().model.chunk_ms == CHUNK * 20


@pytest.mark.skipif(not fused_linear.fusable(torch.zeros(1, dtype=torch.bfloat16)),
                    reason="this CPU does not multiply bfloat16 natively (nothing to prepack)")
def test_a_bfloat16_engine_packs_its_weights_before_the_first_chunk(whisper_dir: Path) -> None:
    """Built in bfloat16, the engine's model has every fused weight packed already: the first
    chunk reorders none (the cache holds the same packed tensors after it)."""
    engine = ASREngine(_config(whisper_dir, dtype="bfloat16"))
    model = engine.resources.model
    weights = [layer.weight for block in model.blocks
               for layer in (block.qkv, block.out, block.ffn.up, block.ffn.down)]
    weights += [fused_linear.conv_weight_as_linear(c) for c in (model.conv1, model.conv2)]
    packed = {id(w): fused_linear._PACKED[id(w)][2] for w in weights}  # KeyError: not packed
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, np.zeros(16000, dtype=np.float32)))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    assert all(fused_linear._PACKED[id(w)][2] is packed[id(w)] for w in weights)


def test_batched_streams_equal_each_stream_alone(whisper_dir: Path,
                                                 speech: list[np.ndarray]) -> None:
    config = _config(whisper_dir)
    audios = [a[: 16000 * 3] for a in speech]
    alone = [_run_alone(config, a) for a in audios]
    engine = ASREngine(config)
    recorder = Recorder(engine)
    events = Collector()
    rng = random.Random(0)
    cursors = [0] * len(audios)
    for sid in range(1, len(audios) + 1):
        engine.submit(OpenStream(sid, events.sink(sid)))
    while any(c < len(a) for c, a in zip(cursors, audios, strict=True)):
        i = rng.randrange(len(audios))
        if cursors[i] < len(audios[i]):
            n = rng.choice([160, 3200, 12000])
            engine.submit(AppendAudio(i + 1, audios[i][cursors[i] : cursors[i] + n]))
            cursors[i] += n
            if cursors[i] >= len(audios[i]):
                engine.submit(EndStream(i + 1))
        if rng.random() < 0.5:
            engine.step()
    run_until_idle(engine)
    assert max(recorder.batch_sizes) > 1, "the streams never shared a forward"
    for i, (_, alone_events, alone_recorder) in enumerate(alone):
        sid = i + 1
        assert events.done(sid).finish_reason == "stop"
        assert events.finals(sid) == alone_events.finals(1)
        torch.testing.assert_close(recorder.stream_log_probs(sid), alone_recorder.stream_log_probs(1),
                                   atol=1e-4, rtol=1e-4)
        assert recorder.stream_log_probs(sid).size(0) == (len(audios[i]) // 160 + 1) // 2
    assert any(events.finals(i + 1) for i in range(len(audios))), "model emitted no text at all"
    assert_pool_full(engine)
    assert engine.resources.states.stream_ids == []


def test_a_step_computes_every_streams_features_in_one_call(
        whisper_dir: Path, speech: list[np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_log_mel_batches(monkeypatch)
    engine = ASREngine(_config(whisper_dir))
    for sid in (1, 2, 3):
        engine.submit(OpenStream(sid, Collector().sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid % len(speech)][:3200]))
    engine.step()
    assert calls == [3]
    engine.submit(AppendAudio(2, speech[2 % len(speech)][3200:6400]))
    engine.step()
    assert calls == [3, 1]  # only the streams with new audio


def test_a_stream_whose_features_fail_ends_alone(whisper_dir: Path,
                                                 speech: list[np.ndarray]) -> None:
    engine = ASREngine(_config(whisper_dir))
    events = Collector()
    for sid in (1, 2, 3):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid % len(speech)][:16000]))
    engine.step()
    engine.requests[2].features.input_finished()  # its next audio is refused
    for sid in (1, 2, 3):
        engine.submit(AppendAudio(sid, speech[sid % len(speech)][16000:32000]))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    (error,) = events.of_type(2, Error)
    assert error.code == "bad_audio" and "after input_finished" in error.message
    assert events.done(2).finish_reason == "error"
    assert events.done(1).finish_reason == events.done(3).finish_reason == "stop"
    assert_pool_full(engine)


def test_abort_and_finish_return_pool_and_state_slots(whisper_dir: Path,
                                                      speech: list[np.ndarray]) -> None:
    engine = ASREngine(_config(whisper_dir))
    events = Collector()
    for sid in (1, 2):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid][:32000]))
    for _ in range(4):
        engine.step()
    assert engine.resources.pool.num_free_blocks < engine.resources.cache_config.max_num_blocks
    engine.submit(AbortStream(1))
    engine.submit(EndStream(2))
    run_until_idle(engine)
    assert events.done(1).finish_reason == "abort"
    assert events.done(2).finish_reason == "stop"
    assert_pool_full(engine)
    assert engine.resources.states.stream_ids == []


def test_position_limit_resets_the_stream_without_losing_audio(short_positions_dir: Path,
                                                               speech: list[np.ndarray]) -> None:
    audio = speech[0][:16000 * 2]  # 2 s = 100 encoder frames = 12.5 chunks of 8
    engine, events, recorder = _run_alone(_config(short_positions_dir), audio)
    chunks = recorder.feats[1]
    assert len(chunks) == 13
    assert engine.stats.endpoints["max_length"] == 4  # after chunks 3, 6, 9 and 12
    finals = events.of_type(1, Final)
    assert [f.reason for f in finals][:4] == ["max_length"] * min(4, len(finals))
    assert all(f.end <= 3 * CHUNK * 0.02 * (k + 1) + 1e-9 for k, f in enumerate(finals[:4]))
    # every frame decoded once: 100 encoder frames of 20 ms
    assert sum(lp.size(0) for lp in recorder.log_probs[1]) == (len(audio) // 160 + 1) // 2
    model = engine.resources.model
    for start in range(0, len(chunks), 3):  # each segment == a fresh stream of its features
        mel = torch.from_numpy(np.concatenate(chunks[start : start + 3]))[None]
        with torch.no_grad():
            want, _ = model(mel, torch.tensor([mel.size(1)]), CHUNK)
        got = torch.cat(recorder.log_probs[1][start : start + 3])
        torch.testing.assert_close(got, want[0], atol=1e-4, rtol=1e-4)
    assert_pool_full(engine)


def test_a_whisper_ctc_bundled_default_serves(whisper_dir: Path, speech: list[np.ndarray],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``model=None`` loads whatever family the bundled directory holds."""
    import oasr.models.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "DEFAULT_MODEL_DIR", whisper_dir)
    engine = ASREngine(_config(whisper_dir, model=None))
    assert isinstance(engine.resources.family, WhisperCtcFamily)
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[0][:16000]))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    assert events.done(1).finish_reason == "stop"
    assert_pool_full(engine)


def test_load_model_dispatches_on_the_model_field(whisper_dir: Path, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:
    import json
    import shutil

    from oasr.models import AsrModel, model_family_of
    from oasr.models.checkpoint import load_oasr_dir

    assert model_family_of(whisper_dir) == "whisper_ctc"
    assert model_family_of(tiny_model_dir) == "conformer_ctc"
    legacy = shutil.copytree(tiny_model_dir, tmp_path / "legacy")  # written before "model" existed
    meta = json.loads((legacy / "config.json").read_text())
    del meta["model"]
    (legacy / "config.json").write_text(json.dumps(meta))
    assert isinstance(load_model(legacy), AsrModel)
    meta["model"] = "rnnt"
    (legacy / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="unknown model family 'rnnt'"):
        load_model(legacy)
    with pytest.raises(ValueError, match="not a Conformer-CTC"):
        load_oasr_dir(whisper_dir)


def test_block_tables_and_pool_ceiling_stop_at_the_position_limit(
        short_positions_dir: Path, whisper_dir: Path) -> None:
    # 3 chunks of positions, blocks of one chunk: a stream never holds more than 3 blocks, + 1
    # in flight; the derived pool (max_num_blocks None) is capped at what the slots can address
    short = ASREngine(_config(short_positions_dir, max_num_blocks=None)).resources.cache_config
    assert short.max_blocks_per_seq == 3 + 1
    assert short.max_num_blocks <= short.max_batch_size * (3 + 1)
    # 1500 positions in blocks of 8 frames: ceil(1500 / 8) + 1 = 189 > the configured 64
    full = ASREngine(_config(whisper_dir, max_num_blocks=None)).resources.cache_config
    assert full.max_blocks_per_seq == EngineConfig.max_blocks_per_seq
