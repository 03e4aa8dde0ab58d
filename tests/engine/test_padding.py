"""The padding lane in the engine: padded cohorts equal unpadded ones, row for row.

A padded engine (``pad_cohorts=True``: what CUDA graphs run on, forced here on CPU) runs each
cohort at the next width of the ladder with pad-lane rows that write only into the scratch
block and the pad row, and rounds its shapes up. Each stream must get the log-probs and text
of the unpadded engine; the scratch block is never a stream's; the pools end full.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full
from support.paths import ZIPFORMER_FIXTURE_DIR
from support.pool_views import pool_k

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.runner.model_runner import BatchPlan, StepOutput
from oasr.engine.runner.padding import StepPadding, StepShape, WidthLadder
from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, save_whisper_ctc


class Recorder:
    """Each stream's log-probs, the cohort sizes and the staged inputs of every step."""

    def __init__(self, engine: ASREngine) -> None:
        self.log_probs: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.batch_sizes: list[int] = []
        self.widths: list[int] = []
        runner = engine.resources.runner
        self._forward, self._run_step = runner.forward, runner.run_step
        runner.forward = self.forward  # type: ignore[method-assign]
        runner.run_step = self.run_step  # type: ignore[method-assign]
        self.staged: list[tuple[int, ...]] = []  # data pointers of each step's inputs

    def forward(self, plan: BatchPlan) -> StepOutput:
        out = self._forward(plan)
        self.batch_sizes.append(len(plan.stream_ids))
        for row, sid in enumerate(plan.stream_ids):
            self.log_probs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out

    def run_step(self, inputs, shape):  # type: ignore[no-untyped-def]
        self.widths.append(shape.width)
        self.staged.append(tuple(t.data_ptr() for t in inputs.tensors()))
        return self._run_step(inputs, shape)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = WhisperCtcConfig(width=32, heads=2, layers=2, max_positions=1500, chunk_frames=8)
    model = WhisperCtcModel(config)
    with torch.no_grad():
        model.positions.copy_(torch.randn_like(model.positions) * 0.5)
    return save_whisper_ctc(model.eval(), tmp_path_factory.mktemp("wctc"), dtype=torch.float32)


def _run(config: EngineConfig, audios: list[np.ndarray]) -> tuple[ASREngine, Collector, Recorder]:
    """Every stream's whole audio at once; steps until idle, checking after each that no
    stream holds the scratch block."""
    engine = ASREngine(config)
    recorder, events = Recorder(engine), Collector()
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    attention = engine.resources.attention
    scratch = set() if attention is None else set(attention.pool.scratch_block_ids)
    for _ in range(10_000):
        engine.step()
        for sid in [] if attention is None else attention.stream_ids:
            assert not scratch & set(attention.stream_info(sid).block_ids)
        if not engine.requests:
            return engine, events, recorder
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("family", ["conformer", "whisper_ctc"])
def test_padded_cohorts_give_every_stream_the_unpadded_result(
        family: str, engine_config: EngineConfig, whisper_dir: Path,
        speech: list[np.ndarray]) -> None:
    config = replace(engine_config, max_batch_size=8, dtype="float32")
    if family == "whisper_ctc":
        config = replace(config, model=str(whisper_dir), max_num_blocks=256)
    audios = [a[: int(16000 * s)] for a, s in zip(speech * 2, (3, 1.2, 2.5, 0.7, 1.9), strict=False)]
    plain_engine, plain, plain_rec = _run(config, audios)
    padded_engine, padded, padded_rec = _run(replace(config, pad_cohorts=True), audios)

    assert plain_engine.resources.pool.num_scratch_blocks == 0
    assert padded_rec.batch_sizes == plain_rec.batch_sizes  # same cohorts ...
    assert 5 in padded_rec.batch_sizes and 8 in padded_rec.widths  # ... 5 rows ran at width 8
    assert all(w in (1, 2, 4, 8) for w in padded_rec.widths)
    for sid in range(1, len(audios) + 1):
        assert padded.finals(sid) == plain.finals(sid)
        assert padded.done(sid).finish_reason == "stop"
        torch.testing.assert_close(torch.cat(padded_rec.log_probs[sid]),
                                   torch.cat(plain_rec.log_probs[sid]), atol=1e-6, rtol=1e-6)
    assert_pool_full(padded_engine)
    assert padded_engine.resources.slots.num_free_slots == 8
    (scratch,) = padded_engine.resources.pool.scratch_block_ids
    assert pool_k(padded_engine.resources.pool)[:, scratch].abs().sum() > 0  # pad rows wrote there


def test_padded_slot_runtime_gives_every_stream_the_unpadded_result(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    config = replace(engine_config, model=str(ZIPFORMER_FIXTURE_DIR), dtype="float32",
                     max_batch_size=4)
    audios = [speech[0][:16000 * 2], speech[2][:16000 * 3], speech[1][:16000]]
    _, plain, plain_rec = _run(config, audios)
    engine, padded, padded_rec = _run(replace(config, pad_cohorts=True), audios)
    assert 3 in padded_rec.batch_sizes and 4 in padded_rec.widths
    for sid in range(1, len(audios) + 1):
        assert padded.finals(sid) == plain.finals(sid)
        # 5e-6 measured: float32 matmuls round by batch width here (its batched-vs-alone test
        # allows 1e-4); outputs are joiner-projected frames of magnitude ~1-10
        torch.testing.assert_close(torch.cat(padded_rec.log_probs[sid]),
                                   torch.cat(plain_rec.log_probs[sid]), atol=1e-5, rtol=0)
    states = engine.resources.states
    assert engine.resources.slots.num_free_slots == 4 and not states.stream_ids


def test_steps_stage_through_the_same_buffers(engine_config: EngineConfig,
                                              speech: list[np.ndarray]) -> None:
    engine, _, recorder = _run(replace(engine_config, pad_cohorts=True), [a[:32000] for a in speech])
    staging = engine.resources.runner.staging
    assert staging is not None and staging.num_uploads == len(recorder.staged)
    # every step's features and index vectors are views of the one set of staging buffers
    assert len({ptrs for ptrs in recorder.staged}) <= len(set(recorder.widths)) * 2
    assert len({ptrs[0] for ptrs in recorder.staged}) == 1  # features start the buffer
    assert len({ptrs[1] for ptrs in recorder.staged}) == 1  # feat_lens start the index buffer


def test_width_ladder() -> None:
    assert WidthLadder(8).widths == (1, 2, 4, 8)
    assert WidthLadder(6).widths == (1, 2, 4, 6)
    assert WidthLadder(1).widths == (1,)
    ladder = WidthLadder(6)
    assert [ladder.width_for(b) for b in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    for bad in (0, 7):
        with pytest.raises(ValueError, match="does not fit the ladder"):
            ladder.width_for(bad)
    with pytest.raises(ValueError, match="max_width"):
        WidthLadder(0)


def test_step_padding_rounds_shapes_up_to_few_values() -> None:
    padding = StepPadding(WidthLadder(64), window_frames=67, chunk_size=16, block_size=16,
                          max_blocks_per_seq=64, offset_sized_positions=True, max_positions=None)
    # 0 held frames + a 16-frame chunk: 1 block; 17..48 held: 4 blocks; full table at most
    assert padding.shape(3, 0, 0) == StepShape(4, 67, 0, 0)
    assert padding.shape(3, 20, 20).host_seqlen == 4 * 16 - 16
    assert padding.shape(3, 48, 48) == StepShape(4, 67, 48, 48)
    assert padding.shape(64, 1000, 1000).host_seqlen == 64 * 16 - 16
    assert padding.shape(5, 16, 100).max_offset == 128 - 16
    shapes = {padding.shape(b, h, h) for b in range(1, 65) for h in range(0, 1000, 16)}
    assert len(shapes) <= 7 * 7 * 7
    whisper = replace(padding, offset_sized_positions=False, max_positions=1500)
    assert {whisper.shape(1, 0, o).max_offset for o in range(0, 1484, 8)} == {1484}
    slot_runtime = replace(padding, offset_sized_positions=False, max_positions=None)
    assert {slot_runtime.shape(1, 0, o).max_offset for o in range(0, 900, 8)} == {0}


def test_engine_config_cuda_graph_modes() -> None:
    cpu = torch.device("cpu")
    assert EngineConfig().cuda_graphs == "off"  # until it has run on a GPU
    assert not EngineConfig(device="cpu", cuda_graphs="auto").resolve_cuda_graphs(cpu)
    assert not EngineConfig(device="cpu").resolve_pad_cohorts(cpu)
    assert EngineConfig(device="cpu", pad_cohorts=True).resolve_pad_cohorts(cpu)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        EngineConfig(device="cpu", cuda_graphs="on").resolve_cuda_graphs(cpu)
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        EngineConfig(cuda_graphs="yes")
    cuda = torch.device("cuda")
    auto = EngineConfig(cuda_graphs="auto")
    assert auto.resolve_cuda_graphs(cuda) and auto.resolve_pad_cohorts(cuda)
    assert not EngineConfig().resolve_cuda_graphs(cuda)
    assert not EngineConfig(cuda_graphs="off").resolve_pad_cohorts(cuda)
    with pytest.raises(ValueError, match="pad_cohorts=False needs"):
        EngineConfig(cuda_graphs="auto", pad_cohorts=False).resolve_pad_cohorts(cuda)
