"""`StepGraphs` on CPU, behind a capture double that records its calls.

The double's capture runs the step once (as a real capture records it) and its replay runs
the recorded closure again on the static inputs, which is what a CUDA graph replay computes.
So the engine run through it checks everything but the CUDA calls themselves: the shape
chosen, inputs copied into the static buffers, one capture per shape on pad-lane inputs,
outputs copied out, the eager fallback. tests/engine/test_cuda_graphs.py checks real graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from test_padding import _run

from oasr.engine import ASREngine, EngineConfig
from oasr.engine.runner.graphs import StepGraphs, StepOut, copy_step_out
from oasr.engine.runner.padding import StepShape
from oasr.engine.runner.staging import StepInputs


class RecordingBackend:
    """Capture = run once and keep the closure; replay = run it again into the static output."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail
        self._runs: list[tuple[Callable[[], StepOut], StepOut]] = []

    def capture(self, run: Callable[[], StepOut]) -> tuple[Any, StepOut]:
        if self.fail:
            raise RuntimeError("capture refused")
        out = run()
        self._runs.append((run, out))
        self.calls.append(("capture", len(self._runs) - 1))
        return len(self._runs) - 1, out

    def replay(self, handle: Any) -> None:
        run, out = self._runs[handle]
        copy_step_out(out, run())
        self.calls.append(("replay", handle))


PAD_SLOT = 9


def _inputs(width: int, frames: int, slots: list[int], fill: float) -> StepInputs:
    return StepInputs(torch.full((width, frames, 3), fill), torch.full((width,), frames),
                      torch.arange(width), torch.tensor(slots))


def _pad_inputs(shape: StepShape) -> StepInputs:
    return _inputs(shape.width, shape.frames, [PAD_SLOT] * shape.width, 0.0)


def _toy_step(seen: list[list[int]]) -> Callable[[StepInputs, StepShape], StepOut]:
    def step(inputs: StepInputs, shape: StepShape) -> StepOut:
        seen.append(inputs.slots.tolist())
        staged = {"toy": inputs.slots[:, None] * 2.0}  # (W, 1): a row's staged state
        return inputs.feats.sum(-1) + inputs.slots[:, None] * shape.max_offset, staged  # (W, T)
    return step


def test_one_capture_per_shape_on_pad_inputs_then_replays() -> None:
    seen: list[list[int]] = []
    backend = RecordingBackend()
    graphs = StepGraphs(_toy_step(seen), backend, _pad_inputs)
    shape = StepShape(width=2, frames=4, host_seqlen=0, max_offset=10)
    first, _ = graphs.run(_inputs(2, 4, [0, PAD_SLOT], 1.0), shape)
    second, second_state = graphs.run(_inputs(2, 4, [3, 1], 2.0), shape)
    assert backend.calls == [("capture", 0), ("replay", 0), ("replay", 0)]
    assert seen[0] == [PAD_SLOT, PAD_SLOT]  # the capture ran on the padding lane only
    assert graphs.captured_shapes == [shape] and graphs.num_replays == 2
    torch.testing.assert_close(first, torch.tensor([[3.0] * 4, [3.0 + 90] * 4]))
    torch.testing.assert_close(second, torch.tensor([[6.0 + 30] * 4, [6.0 + 10] * 4]))
    torch.testing.assert_close(second_state["toy"], torch.tensor([[6.0], [2.0]]))
    static = graphs._graphs[shape]
    assert static.inputs.slots.tolist() == [3, 1]  # inputs were copied into the static buffers
    assert second.data_ptr() != static.output[0].data_ptr()  # the caller gets a copy
    assert second_state["toy"].data_ptr() != static.output[1]["toy"].data_ptr()
    second.zero_()
    assert static.output[0].abs().sum() > 0


def test_shapes_past_the_limit_and_failed_captures_run_eagerly() -> None:
    seen: list[list[int]] = []
    backend = RecordingBackend()
    graphs = StepGraphs(_toy_step(seen), backend, _pad_inputs, max_graphs=1)
    a, b = StepShape(1, 4, 0, 0), StepShape(2, 4, 0, 0)
    graphs.run(_inputs(1, 4, [0], 1.0), a)
    out, _ = graphs.run(_inputs(2, 4, [0, 1], 1.0), b)
    assert graphs.captured_shapes == [a] and graphs.num_eager == 1
    torch.testing.assert_close(out, torch.full((2, 4), 3.0))
    failing = StepGraphs(_toy_step(seen), RecordingBackend(fail=True), _pad_inputs)
    for _ in range(2):
        torch.testing.assert_close(failing.run(_inputs(1, 4, [0], 1.0), a)[0],
                                   torch.full((1, 4), 3.0))
    assert failing.captured_shapes == [] and failing.num_eager == 2  # not retried


def test_replay_refuses_inputs_of_another_shape() -> None:
    graphs = StepGraphs(_toy_step([]), RecordingBackend(), _pad_inputs)
    shape = StepShape(2, 4, 0, 0)
    graphs.run(_inputs(2, 4, [0, 1], 1.0), shape)
    with pytest.raises(ValueError, match="captured at"):
        graphs.run(_inputs(2, 5, [0, 1], 1.0), shape)


def test_graphed_engine_gives_every_stream_the_eager_unpadded_result(
        engine_config: EngineConfig, speech: list[np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    config = replace(engine_config, max_batch_size=8, dtype="float32")
    audios = [speech[2], speech[3], speech[0], speech[2][: 16000 * 7], speech[1]]  # 11 .. 2.4 s
    _, plain, plain_rec = _run(config, audios)
    backend = RecordingBackend()
    graphed_config = replace(config, pad_cohorts=True)

    build = ASREngine.__init__

    def with_graphs(self: ASREngine, cfg: EngineConfig, resources: Any = None) -> None:
        build(self, cfg, resources)
        self.resources.runner.enable_graphs(backend)

    monkeypatch.setattr(ASREngine, "__init__", with_graphs)
    engine, graphed, graphed_rec = _run(graphed_config, audios)
    graphs = engine.resources.runner.graphs
    assert graphs is not None and graphs.num_eager == 0
    captures = [h for kind, h in backend.calls if kind == "capture"]
    assert len(captures) == len(graphs.captured_shapes) == len(set(graphs.captured_shapes))
    assert graphs.num_replays == len(graphed_rec.batch_sizes) > len(captures)
    assert {s.width for s in graphs.captured_shapes} <= {1, 2, 4, 8}
    for sid in range(1, len(audios) + 1):
        assert graphed.finals(sid) == plain.finals(sid)
        torch.testing.assert_close(torch.cat(graphed_rec.log_probs[sid]),
                                   torch.cat(plain_rec.log_probs[sid]), atol=1e-6, rtol=1e-6)


def test_graphs_need_a_padded_runner(engine_config: EngineConfig) -> None:
    engine = ASREngine(engine_config)
    with pytest.raises(ValueError, match="build the runner with padding"):
        engine.resources.runner.enable_graphs(RecordingBackend())
