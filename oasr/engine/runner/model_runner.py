"""ModelRunner: one batched paged encoder call for a cohort of streams at any offsets."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from oasr.audio import FeatureWindow
from oasr.cache import AttentionCacheManager, SlotStateCache
from oasr.cache.slots import slots_to_device
from oasr.engine.families.base import ChunkBatch, ModelFamily
from oasr.engine.runner.graphs import GraphBackend, StepGraphs, StepOut
from oasr.engine.runner.padding import StepPadding, StepShape
from oasr.engine.runner.staging import StepInputs, StepStaging


@dataclass(frozen=True)
class BatchPlan:
    """The cohort of one step, in batch-row order.

    Attributes:
        stream_ids: (B,) stream of each row.
        slots: (B,) the stream's slot (its row in the block table and the state tensors).
        windows: each row's feature window (rows may be shorter than the longest: a last chunk).
        offsets: (B,) encoder frames each stream has seen since its last reset.
    """

    stream_ids: list[int]
    slots: list[int]
    windows: list[FeatureWindow]
    offsets: list[int]

    @property
    def num_output_frames(self) -> list[int]:
        return [w.num_output_frames for w in self.windows]

    def select(self, rows: list[int]) -> BatchPlan:
        """The sub-cohort of the given rows, in that order."""
        return BatchPlan(
            stream_ids=[self.stream_ids[i] for i in rows],
            slots=[self.slots[i] for i in rows],
            windows=[self.windows[i] for i in rows],
            offsets=[self.offsets[i] for i in rows],
        )


@dataclass(frozen=True)
class StepOutput:
    """The encoder's answer for a cohort, and the state it would leave behind.

    Attributes:
        log_probs: (B, T', V) CTC log-probabilities, rows padded to the longest chunk.
        lengths: (B,) valid frames of each row (host list, known without a device sync).
        staged: the new fixed-extent state of the step's rows, per spec name, in the stored
            layout with the step's W >= B rows on the spec's slot axis. Not yet written:
            `ModelRunner.commit` writes it once the chunk succeeded.
        staged_rows: (B,) the row of ``staged`` that belongs to each of this output's rows;
            None for rows 0..B-1.
    """

    log_probs: torch.Tensor
    lengths: list[int]
    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    staged_rows: tuple[int, ...] | None = None

    def select(self, rows: list[int]) -> StepOutput:
        """The output of the given rows, in that order (their staged state with them)."""
        mine = self.staged_rows if self.staged_rows is not None else range(len(self.lengths))
        return StepOutput(self.log_probs[rows], [self.lengths[i] for i in rows], self.staged,
                          tuple(mine[i] for i in rows))

    @staticmethod
    def concat(outputs: list[StepOutput]) -> StepOutput:
        """Rows of several outputs as one, padded to the longest chunk (log-probs and
        lengths only: each output's staged state belongs to its own step)."""
        if not outputs:
            return StepOutput(torch.zeros(0, 0, 0), [])
        longest = max(o.log_probs.size(1) for o in outputs)
        padded = [F.pad(o.log_probs, (0, 0, 0, longest - o.log_probs.size(1))) for o in outputs]
        return StepOutput(torch.cat(padded, dim=0), [n for o in outputs for n in o.lengths])


class ModelRunner:
    """Owns the model call: stages the windows, builds the paged views, runs, commits.

    The model is reached only through its `ModelFamily`, so the same runner serves the
    Conformer and Whisper-CTC. The three phases are separate so the engine can isolate a
    failing stream: `prepare` allocates each row's block once; `forward` may be retried on
    sub-cohorts without allocating again, and changes no stream's state (its K/V lands past
    each row's committed frames, its fixed-extent state is staged in the output); `commit`
    makes a row's chunk part of its history (K/V frames counted, eviction, state written),
    only for the rows whose whole chunk, decoding included, succeeded
    (`oasr.engine.runner.isolation.step_isolating_failures`).

    With ``padding`` (`oasr.engine.runner.padding`) a cohort runs at the next width of a ladder, its
    extra rows on the padding lane (they write only into the pool's scratch block and the
    state caches' pad row; their outputs are dropped), with its shapes rounded up so that few
    shapes recur; `enable_graphs` then replays each shape as a captured graph. Inputs reach
    the device through `StepStaging` (persistent buffers, asynchronous copies).
    """

    def __init__(self, family: ModelFamily, attention: AttentionCacheManager | None,
                 states: SlotStateCache, device: torch.device, dtype: torch.dtype,
                 padding: StepPadding | None = None) -> None:
        self.family = family
        self.attention = attention
        self.states = states
        self.device = device
        self.dtype = dtype
        self.padding = padding
        self.graphs: StepGraphs | None = None
        self.staging: StepStaging | None = None
        self._latest: tuple[list[int], StepOutput] | None = None  # the last forward's output
        if padding is not None and not self._pad_lane_slots:
            raise ValueError("padded steps need a pad lane: build the caches with pad_lanes=1")

    @property
    def model(self) -> torch.nn.Module:
        return self.family.model

    def enable_graphs(self, backend: GraphBackend, max_graphs: int = 64) -> StepGraphs:
        """Replay padded steps as graphs captured by ``backend`` (one per step shape).

        Raises:
            ValueError: the runner does not pad (a graph needs fixed widths).
        """
        if self.padding is None:
            raise ValueError("graphs replay fixed widths: build the runner with padding")
        self.graphs = StepGraphs(self.run_step, backend, self.pad_inputs, max_graphs)
        return self.graphs

    def prepare(self, plan: BatchPlan) -> None:
        """Allocate the blocks every row's chunk needs: one pool allocation for the cohort
        (nothing for a family without paged K/V)."""
        if self.attention is not None:
            self.attention.prepare_chunks_batched(plan.stream_ids)

    @torch.inference_mode()
    def forward(self, plan: BatchPlan) -> StepOutput:
        """Run the encoder and CTC head on the cohort's windows in one call. Nothing a
        stream holds changes: the chunk's K/V lands past each row's committed frames and the
        rows' new fixed-extent state comes back staged in the output (`commit` writes both)."""
        shape = self.step_shape(plan)
        slots = self._slot_list(plan.stream_ids, shape.width)
        staging = self._staging_for(shape.frames, plan.windows[0].feats.shape[1])
        inputs = staging.upload(plan.windows, plan.offsets, slots, shape.frames)
        if self.attention is not None:
            self.attention.flush_tables()  # a replay reads the tables without flushing them
        if self.graphs is not None:
            log_probs, staged = self.graphs.run(inputs, shape)  # (W, T', V)
        else:
            log_probs, staged = self.run_step(inputs, shape)
        output = StepOutput(log_probs[: len(plan.stream_ids)], plan.num_output_frames, staged)
        self._latest = (list(plan.stream_ids), output)
        return output

    def step_shape(self, plan: BatchPlan) -> StepShape:
        """The cohort's shape: exact, or padded up (`StepPadding.shape`)."""
        held = 0
        if self.attention is not None:
            held = self.attention.max_cached_frames(plan.stream_ids)
        if self.padding is not None:
            return self.padding.shape(len(plan.stream_ids), held, max(plan.offsets))
        return StepShape(len(plan.stream_ids), max(w.num_frames for w in plan.windows), held,
                         max(plan.offsets))

    def run_step(self, inputs: StepInputs, shape: StepShape) -> StepOut:
        """The eager step (what a graph records): paged views and staged state views of the
        rows in ``inputs.slots``, one family forward.

        Returns:
            (W, T', V) the family's output, pad rows included, and the state its forward
            scattered, per spec name (W rows on each slot axis), not yet written.
        """
        staged: dict[str, torch.Tensor] = {}
        batch = ChunkBatch(
            feats=inputs.feats.to(self.dtype),  # (W, T, F), staged in the dtype: no copy
            feat_lens=inputs.feat_lens,
            offsets=inputs.offsets,
            max_offset=shape.max_offset,
            caches=([] if self.attention is None
                    else self.attention.paged_caches_for_slots(inputs.slots, shape.host_seqlen)),
            states=self.states.views_for_slots(inputs.slots, staged),
        )
        return self.family.forward_chunk(batch), staged

    def pad_inputs(self, shape: StepShape) -> StepInputs:
        """Inputs of ``shape`` whose every row is the padding lane (a capture's static inputs)."""
        assert self.staging is not None, "a step stages its inputs before any capture"
        width, frames, device = shape.width, shape.frames, self.device
        return StepInputs(
            feats=torch.zeros(width, frames, self.staging.feat_dim, dtype=self.dtype,
                              device=device),
            feat_lens=torch.full((width,), frames, dtype=torch.int64, device=device),
            offsets=torch.zeros(width, dtype=torch.int64, device=device),
            slots=torch.full((width,), self._pad_lane_slots[0], dtype=torch.int64, device=device),
        )

    def commit(self, plan: BatchPlan, output: StepOutput | None = None) -> None:
        """Make the rows' chunk part of their streams: write their staged fixed-extent state
        and count their new K/V frames (eviction happens here).

        Args:
            plan: the rows to commit (all of ``output``'s rows, in its order).
            output: what `forward` returned for exactly these rows (``select`` it for a
                sub-cohort); None: the latest `forward`'s, which must have been of ``plan``.
        Raises:
            RuntimeError: ``output`` None and the latest forward ran other streams.
            ValueError: ``output`` has another number of rows than ``plan``.
        """
        if output is None:
            if self._latest is None or self._latest[0] != list(plan.stream_ids):
                raise RuntimeError(
                    f"commit of streams {plan.stream_ids} without their output: the latest "
                    f"forward ran {None if self._latest is None else self._latest[0]}; pass "
                    "the StepOutput of these rows")
            output = self._latest[1]
        self._latest = None  # a step keeps no tensor past its commit
        if len(output.lengths) != len(plan.stream_ids):
            raise ValueError(f"commit of {len(plan.stream_ids)} rows with an output of "
                             f"{len(output.lengths)}")
        if output.staged and plan.stream_ids:
            slots = slots_to_device(plan.slots, self.device)
            rows = None
            if output.staged_rows is not None and list(output.staged_rows) != list(
                    range(len(plan.slots))):
                rows = slots_to_device(output.staged_rows, self.device)
            self.states.write_rows(slots, output.staged, rows)
        if self.attention is None:
            return
        for stream_id, frames in zip(plan.stream_ids, plan.num_output_frames, strict=True):
            self.attention.commit_chunk_paged(stream_id, frames)

    @property
    def _pad_lane_slots(self) -> tuple[int, ...]:
        if self.attention is not None:
            return self.attention.pad_lane_slots if self.states.pad_lane_slots else ()
        return self.states.pad_lane_slots

    def _slot_list(self, stream_ids: list[int], width: int) -> list[int]:
        if self.attention is not None:
            return self.attention.batch_slot_list(stream_ids, pad_to=width)
        return self.states.batch_slot_list(stream_ids, pad_to=width)

    def _staging_for(self, frames: int, feat_dim: int) -> StepStaging:
        """The staging buffers, (re)allocated only when a step outgrows them."""
        staging = self.staging
        rows = self.states.num_rows
        if staging is None or frames > staging.max_frames or feat_dim != staging.feat_dim:
            window = 0 if self.padding is None else self.padding.window_frames
            staging = StepStaging(rows, max(frames, window), feat_dim, self.device, self.dtype)
            self.staging = staging
        return staging
