"""CUDA only (skipped elsewhere): real graph capture and the host syncs of a step.

- a graphed engine (``cuda_graphs="on"``) gives every stream the log-probs and text of the
  eager unpadded engine, with every step replayed;
- a warmed-up forward (staging, table flush, replay or eager step) makes no host sync
  (``torch.cuda.set_sync_debug_mode("error")`` raises on one);
- a whole engine step syncs once: the decoder's read-back.
bench/gpu_check.sh runs these on a GPU machine.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector
from test_padding import Recorder

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CHUNK_SAMPLES = 16000 * 64 // 100  # 640 ms: one Conformer chunk


def _cuda_config(engine_config: EngineConfig, graphs: str) -> EngineConfig:
    # float32 so graphed and eager compare tightly; no TF32 in either (torch's default)
    return replace(engine_config, device="cuda", dtype="float32", max_batch_size=8,
                   cuda_graphs=graphs)


def _run_all(config: EngineConfig, audios: list[np.ndarray]) -> tuple[ASREngine, Collector, Recorder]:
    engine = ASREngine(config)
    recorder, events = Recorder(engine), Collector()
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    while engine.requests:
        engine.step()
    return engine, events, recorder


def test_replayed_graphs_equal_the_eager_unpadded_engine(engine_config: EngineConfig,
                                                          speech: list[np.ndarray]) -> None:
    audios = [speech[2], speech[3], speech[0], speech[2][: 16000 * 7], speech[1]]
    _, eager, eager_rec = _run_all(_cuda_config(engine_config, "off"), audios)
    engine, graphed, graphed_rec = _run_all(_cuda_config(engine_config, "on"), audios)
    graphs = engine.resources.runner.graphs
    assert graphs is not None and graphs.num_eager == 0
    assert graphs.num_replays == len(graphed_rec.batch_sizes)
    assert engine.resources.runner.staging._host_feats.is_pinned()
    for sid in range(1, len(audios) + 1):
        assert graphed.finals(sid) == eager.finals(sid)
        torch.testing.assert_close(torch.cat(graphed_rec.log_probs[sid]),
                                   torch.cat(eager_rec.log_probs[sid]), atol=1e-4, rtol=1e-4)


def _live_engine(config: EngineConfig, speech: list[np.ndarray], warm_steps: int) -> ASREngine:
    """Four streams fed 640 ms per step, ``warm_steps`` steps run (captures happen there)."""
    engine = ASREngine(config)
    for sid in range(1, 5):
        engine.submit(OpenStream(sid, lambda event: None))
    for step in range(warm_steps):
        _feed(engine, speech, step)
        engine.step()
    return engine


def _feed(engine: ASREngine, speech: list[np.ndarray], step: int) -> None:
    for sid in range(1, 5):
        audio = speech[2]
        engine.submit(AppendAudio(sid, audio[step * CHUNK_SAMPLES : (step + 1) * CHUNK_SAMPLES]))


@pytest.mark.parametrize("graphs", ["on", "off"])
def test_a_warm_forward_makes_no_host_sync(engine_config: EngineConfig, speech: list[np.ndarray],
                                           graphs: str) -> None:
    engine = _live_engine(_cuda_config(engine_config, graphs), speech, warm_steps=4)
    runner = engine.resources.runner
    forward = runner.forward

    def strict_forward(plan):  # type: ignore[no-untyped-def]
        torch.cuda.set_sync_debug_mode("error")
        try:
            return forward(plan)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    runner.forward = strict_forward  # type: ignore[method-assign]
    for step in range(4, 7):
        _feed(engine, speech, step)
        engine.step()  # raises if the forward synchronised
    for sid in range(1, 5):
        engine.submit(EndStream(sid))


def test_a_step_syncs_once(engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    engine = _live_engine(_cuda_config(engine_config, "on"), speech, warm_steps=4)
    counts = []
    for step in range(4, 7):
        _feed(engine, speech, step)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    print(f"host syncs per step: {counts}")
    assert counts == [1, 1, 1]  # the decoder's one read-back
