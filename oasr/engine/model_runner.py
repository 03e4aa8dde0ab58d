"""ModelRunner: one batched paged encoder call for a cohort of streams at any offsets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from oasr.audio import FeatureWindow
from oasr.cache import AttentionCacheManager, SlotStateCache
from oasr.engine.family import ChunkBatch, ModelFamily


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
    """The encoder's answer for a cohort.

    Attributes:
        log_probs: (B, T', V) CTC log-probabilities, rows padded to the longest chunk.
        lengths: (B,) valid frames of each row (host list, known without a device sync).
    """

    log_probs: torch.Tensor
    lengths: list[int]

    @staticmethod
    def concat(outputs: list[StepOutput]) -> StepOutput:
        """Rows of several outputs as one, padded to the longest chunk."""
        if not outputs:
            return StepOutput(torch.zeros(0, 0, 0), [])
        longest = max(o.log_probs.size(1) for o in outputs)
        padded = [F.pad(o.log_probs, (0, 0, 0, longest - o.log_probs.size(1))) for o in outputs]
        return StepOutput(torch.cat(padded, dim=0), [n for o in outputs for n in o.lengths])


class ModelRunner:
    """Owns the model call: stacks windows, builds the paged views, runs, commits.

    The model is reached only through its `ModelFamily`, so the same runner serves the
    Conformer and Whisper-CTC. The three phases are separate so the engine can isolate a
    failing stream: `prepare` allocates each row's block once; `forward` may be retried on
    sub-cohorts without allocating again; `commit` records the frames of the rows that
    succeeded.
    """

    def __init__(self, family: ModelFamily, attention: AttentionCacheManager | None,
                 states: SlotStateCache, device: torch.device, dtype: torch.dtype) -> None:
        self.family = family
        self.attention = attention
        self.states = states
        self.device = device
        self.dtype = dtype

    @property
    def model(self) -> torch.nn.Module:
        return self.family.model

    def prepare(self, plan: BatchPlan) -> None:
        """Allocate the blocks every row's chunk needs: one pool allocation for the cohort
        (nothing for a family without paged K/V)."""
        if self.attention is not None:
            self.attention.prepare_chunks_batched(plan.stream_ids)

    @torch.inference_mode()
    def forward(self, plan: BatchPlan) -> StepOutput:
        """Run the encoder and CTC head on the cohort's windows in one call; the rows' new
        fixed-extent state is written back only when the call succeeds."""
        feats, feat_lens = self._stack_windows(plan.windows)
        batch = ChunkBatch(
            feats=feats,
            feat_lens=feat_lens,
            offsets=torch.tensor(plan.offsets, dtype=torch.int64, device=self.device),
            max_offset=max(plan.offsets),
            caches=([] if self.attention is None
                    else self.attention.get_batched_paged_caches(plan.stream_ids)),
            states=self.states.views(plan.stream_ids),
        )
        log_probs = self.family.forward_chunk(batch)  # (B, T', V)
        return StepOutput(log_probs, plan.num_output_frames)

    def commit(self, plan: BatchPlan) -> None:
        """Record each row's new frames (eviction happens here)."""
        if self.attention is None:
            return
        for stream_id, frames in zip(plan.stream_ids, plan.num_output_frames, strict=True):
            self.attention.commit_chunk_paged(stream_id, frames)

    def _stack_windows(self, windows: list[FeatureWindow]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(w.num_frames for w in windows)
        dim = windows[0].feats.shape[1]
        stacked = np.zeros((len(windows), longest, dim), dtype=np.float32)  # (B, T, F)
        for row, window in enumerate(windows):
            stacked[row, : window.num_frames] = window.feats
        feats = torch.from_numpy(stacked).to(self.device, self.dtype, non_blocking=True)
        lens = torch.tensor([w.num_frames for w in windows], dtype=torch.int64, device=self.device)
        return feats, lens
