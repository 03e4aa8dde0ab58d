"""ASREngine serving icefall's Zipformer on the slot runtime (the fixture model).

No paged blocks: every per-stream tensor is a declared slot row. Streams at different offsets
share one batched streaming step, each stream's encoder frames and transcript equal running it
alone, the engine's windows and slot rows reproduce the model's own icefall-compatible
streaming, and every slot is back after each scenario.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector, run_until_idle, stream_all
from support.paths import ZIPFORMER_FIXTURE_DIR

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AbortStream, AppendAudio, EndStream, OpenStream
from oasr.engine.families.zipformer import ZipformerFamily
from oasr.engine.runner.model_runner import BatchPlan, StepOutput
from oasr.models import load_model
from oasr.models.zipformer import ZipformerModel


def _config(**overrides: object) -> EngineConfig:
    config = EngineConfig(model=str(ZIPFORMER_FIXTURE_DIR), device="cpu", dtype="float32",
                          max_batch_size=4, max_wait_time_s=math.inf, endpoint=None)
    return replace(config, **overrides)  # type: ignore[arg-type]


class Recorder:
    """Wraps the runner's forward: each stream's windows, offsets and outputs, batch sizes."""

    def __init__(self, engine: ASREngine) -> None:
        self.windows: dict[int, list[np.ndarray]] = defaultdict(list)
        self.outputs: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.offsets: list[list[int]] = []
        self._forward = engine.resources.runner.forward
        engine.resources.runner.forward = self.forward  # type: ignore[method-assign]

    def forward(self, plan: BatchPlan) -> StepOutput:
        out = self._forward(plan)
        self.offsets.append(list(plan.offsets))
        for row, (sid, window) in enumerate(zip(plan.stream_ids, plan.windows, strict=True)):
            self.windows[sid].append(window.feats)
            self.outputs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out

    def stream(self, sid: int) -> torch.Tensor:
        return torch.cat(self.outputs[sid])


def _run_alone(config: EngineConfig, audio: np.ndarray) -> tuple[Collector, Recorder]:
    engine = ASREngine(replace(config, max_batch_size=1))
    recorder = Recorder(engine)
    events = stream_all(engine, audio)
    run_until_idle(engine)
    return events, recorder


def _run_interleaved(config: EngineConfig, audios: list[np.ndarray]) -> tuple[ASREngine, Collector, Recorder]:
    """Streams opened at different times, audio in random pieces, steps in between."""
    engine = ASREngine(config)
    recorder, events = Recorder(engine), Collector()
    rng = random.Random(0)
    cursors = [0] * len(audios)
    opened: set[int] = set()
    while any(c < len(a) for c, a in zip(cursors, audios, strict=True)):
        i = rng.randrange(len(audios))
        if i not in opened and (i == 0 or i - 1 in opened and rng.random() < 0.3):
            engine.submit(OpenStream(i + 1, events.sink(i + 1)))
            opened.add(i)
        if i in opened and cursors[i] < len(audios[i]):
            n = rng.choice([1600, 4800, 9600])
            engine.submit(AppendAudio(i + 1, audios[i][cursors[i] : cursors[i] + n]))
            cursors[i] += n
            if cursors[i] >= len(audios[i]):
                engine.submit(EndStream(i + 1))
        engine.step()
    run_until_idle(engine)
    return engine, events, recorder


def _assert_slots_back(engine: ASREngine) -> None:
    res = engine.resources
    assert res.pool is None and res.attention is None  # no paged blocks at all
    assert res.num_free_slots == res.cache_config.max_batch_size
    assert res.states.stream_ids == []
    assert res.transducer is not None and not any(s in res.transducer for s in range(1, 9))
    pool = engine.latest_stats().pool
    assert pool.kind == "slots" and pool.num_used_slots == 0


def test_the_family_declares_its_state_and_keeps_no_paged_pool() -> None:
    engine = ASREngine(_config())
    res = engine.resources
    assert isinstance(res.family, ZipformerFamily) and res.family.decoding == "transducer"
    assert res.chunk_size == 8  # 16 frames at 50 Hz = 8 encoder frames of 40 ms
    assert res.pool is None and res.attention is None
    assert len(res.states.specs) == 6 * 6 + 2
    assert res.states.num_rows == 4 + 1  # a pad lane
    assert res.states.buffers["processed_lens"].dtype == torch.int32
    assert res.states.buffers["layer3.cached_key"].shape == (64 // 8, 5, 8 * 8)  # slot axis 1
    stats = engine.latest_stats()
    assert stats.pool.kind == "slots" and stats.pool.num_blocks == 0
    assert stats.pool.num_slots == 4 and stats.model.family == "zipformer"


def test_the_engine_chunk_picks_icefalls_decode_setting() -> None:
    """--chunk-size 16 --num-left-chunks 4 is icefall's --chunk-size 32 --left-context-frames
    128; a model already loaded for another chunk is refused with the call that fixes it."""
    from oasr.engine.runner.streams import StreamResources

    res = ASREngine(_config(chunk_size=16, num_left_chunks=4)).resources
    model = res.model
    assert isinstance(model, ZipformerModel)
    assert (model.config.chunk_size, model.config.left_context_frames) == (32, 128)
    assert res.states.buffers["layer3.cached_key"].shape[0] == 128 // 8
    with pytest.raises(ValueError, match="chunk_size 16 needs load_model"):
        config = _config(chunk_size=16)
        ASREngine(config, StreamResources.build(config, load_model(ZIPFORMER_FIXTURE_DIR)))


@pytest.mark.slow
def test_batched_streams_at_different_offsets_equal_each_alone(speech: list[np.ndarray]) -> None:
    config = _config()
    audios = [a[: 16000 * 3] for a in speech[:3]]
    alone = [_run_alone(config, a) for a in audios]
    engine, events, recorder = _run_interleaved(config, audios)
    mixed = [o for o in recorder.offsets if len(o) > 1 and len(set(o)) > 1]
    assert mixed, f"no batched call mixed stream offsets: {recorder.offsets}"
    for i, (alone_events, alone_recorder) in enumerate(alone):
        sid = i + 1
        assert events.done(sid).finish_reason == "stop"
        torch.testing.assert_close(recorder.stream(sid), alone_recorder.stream(1), atol=1e-4, rtol=0)
        assert events.finals(sid) == alone_events.finals(1)
    assert any(events.finals(i + 1) for i in range(len(audios))), "the model emitted nothing"
    _assert_slots_back(engine)


@pytest.mark.slow
def test_engine_windows_and_slot_rows_reproduce_the_models_streaming(speech: list[np.ndarray]) -> None:
    """The engine's slot rows carry state exactly as icefall's list API does: the recorded
    windows fed through ``streaming_forward`` alone give the engine's frames."""
    engine, _, recorder = _run_interleaved(_config(), [a[: 16000 * 2] for a in speech[:2]])
    model = engine.resources.model
    assert isinstance(model, ZipformerModel)
    width = model.config.window_frames
    for sid in (1, 2):
        states, outs = model.get_init_states(1), []
        with torch.no_grad():
            for feats in recorder.windows[sid]:
                w = torch.full((1, width, feats.shape[1]), -23.025850929940457)
                w[0, : feats.shape[0]] = torch.from_numpy(feats)
                enc, _, states = model.streaming_forward(w, torch.tensor([width]), states)
                outs.append(model.joiner.encoder_proj(enc[0]))
        want = torch.cat([o[: len(r)] for o, r in zip(outs, recorder.outputs[sid], strict=True)])
        torch.testing.assert_close(recorder.stream(sid), want, atol=1e-4, rtol=0)
    _assert_slots_back(engine)


def test_abort_reset_and_finish_return_every_slot(speech: list[np.ndarray]) -> None:
    engine = ASREngine(_config())
    events = Collector()
    for sid in (1, 2, 3):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid][:24000]))
    for _ in range(3):
        engine.step()
    res = engine.resources
    engine.stats.refresh(engine.requests, engine.scheduler)  # not only every 0.1 s
    assert res.num_free_slots == 1 and engine.latest_stats().pool.num_used_slots == 3
    slot = res.states.slot_of(2)
    assert res.states.buffers["embed_left_pad"][slot].abs().sum() > 0
    res.reset_stream(2)  # an endpoint: rows zeroed in place, slot and hypothesis start over
    assert res.states.slot_of(2) == slot
    assert all(float(res.states.slot_view(2, name).abs().sum()) == 0 for name in res.states.specs)
    assert res.final_hypothesis(2).tokens == []
    engine.submit(AbortStream(1))
    engine.submit(EndStream(2))
    engine.submit(EndStream(3))
    run_until_idle(engine)
    assert events.done(1).finish_reason == "abort"
    assert events.done(2).finish_reason == "stop" and events.done(3).finish_reason == "stop"
    _assert_slots_back(engine)


def test_endpoints_reset_segments_through_the_slot_pool(speech: list[np.ndarray]) -> None:
    from oasr.decoding import EndpointConfig, EndpointRule

    rule = EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0,
                        min_utterance_length_s=0.64)
    engine = ASREngine(_config(endpoint=EndpointConfig(rule1=None, rule2=None, rule3=rule)))
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    engine.submit(AppendAudio(1, speech[0][: 16000 * 3]))
    engine.submit(EndStream(1))
    run_until_idle(engine)
    assert engine.stats.endpoints["rule3"] >= 3
    assert len(events.finals(1)) >= 3
    _assert_slots_back(engine)


def test_a_ctc_only_zipformer_decodes_with_the_ctc_head(speech: list[np.ndarray]) -> None:
    model = load_model(ZIPFORMER_FIXTURE_DIR)
    assert isinstance(model, ZipformerModel)
    model.config = dataclasses.replace(model.config, use_transducer=False)
    from oasr.engine.runner.streams import StreamResources

    config = _config(max_batch_size=2)
    engine = ASREngine(config, StreamResources.build(config, model))
    assert isinstance(engine.resources.family, ZipformerFamily)
    assert engine.resources.family.decoding == "ctc" and engine.resources.transducer is None
    recorder, events = Recorder(engine), Collector()
    for sid in (1, 2):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, speech[sid][: 16000 * 2]))
        engine.submit(EndStream(sid))
    run_until_idle(engine)
    for sid in (1, 2):
        logp = recorder.stream(sid)
        assert logp.shape[1] == 50 and torch.allclose(logp.exp().sum(-1), torch.ones(len(logp)))
        assert events.done(sid).finish_reason == "stop"
    assert engine.resources.num_free_slots == 2 and engine.resources.states.stream_ids == []


def test_beam_size_selects_modified_beam_search(speech: list[np.ndarray]) -> None:
    """--beam-size 4: the final of each stream is icefall's modified beam search (beam 4) over
    the stream's frames, batched or alone."""
    from oasr.decoding import GpuDecoderConfig

    config = _config(decoder=GpuDecoderConfig(beam_size=4), max_batch_size=2)
    audios = [a[: 16000 * 2] for a in speech[1:3]]
    engine, events, recorder = _run_interleaved(config, audios)
    assert engine.resources.transducer is not None and engine.resources.transducer.beam == 4
    model = engine.resources.model
    assert isinstance(model, ZipformerModel)
    for sid in (1, 2):
        states = model.new_beam_states(1)
        with torch.no_grad():
            for out in recorder.outputs[sid]:
                model.beam_step(out[None], [out.shape[0]], states, beam=4)
        text = engine.resources.family.tokenizer.decode(list(states[0].best().tokens))
        assert events.finals(sid) == ([text] if text else [])
        alone_events, _ = _run_alone(config, audios[sid - 1])
        assert alone_events.finals(1) == events.finals(sid)
    assert any(events.finals(sid) for sid in (1, 2)), "the model emitted nothing"
    _assert_slots_back(engine)
