"""The engine's history is the last ``num_left_chunks`` chunks whatever the block size
(issue #49, item 2): with eviction by frame the pool's block size is a storage detail, so the
same streams decode the same log-probs with blocks of a chunk, half a chunk, two chunks and
blocks that chunks straddle, batched and padded alike."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import Collector, assert_pool_full

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.runner.model_runner import BatchPlan, StepOutput


def _run(config: EngineConfig, audios: list[np.ndarray]) -> tuple[ASREngine, Collector,
                                                                   dict[int, torch.Tensor]]:
    engine = ASREngine(config)
    outputs: dict[int, list[torch.Tensor]] = defaultdict(list)
    forward = engine.resources.runner.forward

    def recording(plan: BatchPlan) -> StepOutput:
        out = forward(plan)
        for row, sid in enumerate(plan.stream_ids):
            outputs[sid].append(out.log_probs[row, : out.lengths[row]].clone())
        return out

    engine.resources.runner.forward = recording  # type: ignore[method-assign]
    events = Collector()
    for sid, audio in enumerate(audios, start=1):
        engine.submit(OpenStream(sid, events.sink(sid)))
        engine.submit(AppendAudio(sid, audio))
        engine.submit(EndStream(sid))
    for _ in range(10_000):
        engine.step()
        if not engine.requests:
            return engine, events, {sid: torch.cat(o) for sid, o in outputs.items()}
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("pad", [False, True])
def test_every_block_size_decodes_the_same_history(
        engine_config: EngineConfig, speech: list[np.ndarray], pad: bool) -> None:
    audios = [speech[0][: 16000 * 4], speech[2][: 16000 * 6], speech[3][: 16000 * 5]]
    base = replace(engine_config, dtype="float32", num_left_chunks=2, pad_cohorts=pad,
                   max_num_blocks=None)
    _, reference_events, reference = _run(base, audios)  # block = chunk = 16 frames
    for block in (32, 8, 24, 12):
        engine, events, outputs = _run(replace(base, block_size_frames=block), audios)
        assert engine.resources.cache_config.block_size_frames == block
        for sid in range(1, len(audios) + 1):
            torch.testing.assert_close(outputs[sid], reference[sid], atol=1e-5, rtol=1e-5)
            assert events.finals(sid) == reference_events.finals(sid)
        assert engine.resources.attention.num_evictions > 0
        assert_pool_full(engine)
