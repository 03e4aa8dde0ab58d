"""Captured chunk steps: one graph per step shape, replayed over static buffers.

`StepGraphs` owns, per `StepShape` it has captured, the static input tensors the graph reads
and the static output it writes (the log-probs and the staged fixed-extent state). A step
copies its inputs into the static inputs, replays, and returns a copy of the static output.
Capture runs the step on inputs that address only the padding lane (every row a pad-lane
slot), so warming up and recording a width while streams are live advances none of them: the
captured kernels write K/V into the scratch block until a replay's slots say otherwise, and
state is never written by the step at all (the runner writes the staged rows after it).

The capture and replay primitives are a `GraphBackend`: `CudaGraphBackend` records a
``torch.cuda.CUDAGraph`` (CUDA only); tests inject a double that records the calls.
A shape that is not captured (past ``max_graphs``, or one whose capture failed) runs eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from oasr.engine.runner.padding import StepShape
from oasr.engine.runner.staging import StepInputs

logger = logging.getLogger(__name__)

# What a step returns: its (W, T', V) output, and the new fixed-extent state it staged (per
# spec name, the batch's rows in the stored layout; `ModelRunner` writes it once the chunk
# succeeded). A graph's static output is the same structure.
StepOut = tuple[torch.Tensor, dict[str, torch.Tensor]]
StepFn = Callable[[StepInputs, StepShape], StepOut]


def clone_step_out(out: StepOut) -> StepOut:
    """A copy of a step's output and staged state that the caller owns."""
    return out[0].clone(), {name: t.clone() for name, t in out[1].items()}


def copy_step_out(dst: StepOut, src: StepOut) -> None:
    """Copy ``src`` into ``dst`` (same structure and shapes), in place."""
    dst[0].copy_(src[0])
    for name, t in dst[1].items():
        t.copy_(src[1][name])


class GraphBackend(Protocol):
    """Records a step once and replays it."""

    def capture(self, run: Callable[[], StepOut]) -> tuple[Any, StepOut]:
        """Record ``run``; returns (a handle for `replay`, the static output it writes)."""
        ...

    def replay(self, handle: Any) -> None:
        """Run the recorded step again on whatever its static inputs now hold."""
        ...


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` capture: warm-up on a side stream, then record.

    Every graph shares one memory pool. That is safe here because graphs replay one at a time
    on the engine thread and `StepGraphs.replay` copies a graph's static output out before any
    other graph runs: a later replay may reuse an earlier graph's intermediates, never a value
    still to be read. Static inputs are allocated outside the capture (`pad_inputs`).
    """

    def __init__(self, device: torch.device, warmup: int = 2) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.device = device
        self.warmup = warmup
        self._pool: Any = None

    def capture(self, run: Callable[[], StepOut]) -> tuple[Any, StepOut]:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):  # lazy inits and autotuning happen outside the graph
                run()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = run()
        self._pool = graph.pool()
        return graph, out

    def replay(self, handle: Any) -> None:
        handle.replay()


@dataclass
class _Captured:
    handle: Any
    inputs: StepInputs  # static: replays read these
    output: StepOut  # static: replays write these


class StepGraphs:
    """The captured steps of one engine, keyed by `StepShape`.

    Args:
        step: the eager step (`ModelRunner.run_step`), run under capture and as the fallback.
        backend: capture / replay primitives.
        pad_inputs: static inputs of a shape that address only the padding lane.
        max_graphs: shapes captured at most; later shapes run eagerly.
    """

    def __init__(self, step: StepFn, backend: GraphBackend,
                 pad_inputs: Callable[[StepShape], StepInputs], max_graphs: int = 64) -> None:
        if max_graphs < 0:
            raise ValueError(f"max_graphs must be >= 0, got {max_graphs}")
        self.step = step
        self.backend = backend
        self.pad_inputs = pad_inputs
        self.max_graphs = max_graphs
        self._graphs: dict[StepShape, _Captured] = {}
        self._eager_only: set[StepShape] = set()
        self.num_replays = 0
        self.num_eager = 0

    @property
    def captured_shapes(self) -> list[StepShape]:
        return list(self._graphs)

    def run(self, inputs: StepInputs, shape: StepShape) -> StepOut:
        """The step's output for ``inputs`` (whose shapes are ``shape``'s): replayed when
        ``shape`` is captured (capturing it first when there is room), else eager.

        Returns:
            (width, T', V) and the staged state, tensors the caller owns (not the static
            output).
        """
        captured = self._graphs.get(shape)
        if captured is None and self._can_capture(shape):
            captured = self.capture(shape)
        if captured is None:
            self.num_eager += 1
            return self.step(inputs, shape)
        return self.replay(captured, inputs)

    def _can_capture(self, shape: StepShape) -> bool:
        return shape not in self._eager_only and len(self._graphs) < self.max_graphs

    def capture(self, shape: StepShape) -> _Captured | None:
        """Record the step of ``shape`` on pad-lane inputs; None (and eager from then on)
        when the capture fails."""
        static = self.pad_inputs(shape)
        try:
            handle, output = self.backend.capture(lambda: self.step(static, shape))
        except Exception:
            logger.exception("capturing the step of %s failed; it runs eagerly", shape)
            self._eager_only.add(shape)
            return None
        captured = _Captured(handle, static, output)
        self._graphs[shape] = captured
        logger.info("captured the step of %s (%d graphs)", shape, len(self._graphs))
        return captured

    def replay(self, captured: _Captured, inputs: StepInputs) -> StepOut:
        for static, given in zip(captured.inputs.tensors(), inputs.tensors(), strict=True):
            if static.shape != given.shape:
                raise ValueError(f"replay input of shape {tuple(given.shape)} for a graph "
                                 f"captured at {tuple(static.shape)}")
            static.copy_(given, non_blocking=True)
        self.backend.replay(captured.handle)
        self.num_replays += 1
        return clone_step_out(captured.output)
