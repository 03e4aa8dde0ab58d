"""Helpers shared by the model tests (imported by name: tests/models is on sys.path)."""

from __future__ import annotations

import numpy as np
import torch


def max_diff(a: torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    other = torch.as_tensor(b)
    assert tuple(a.shape) == tuple(other.shape), (tuple(a.shape), tuple(other.shape))
    return float((a.detach().float() - other.float()).abs().max())


WINDOW = 67  # fbank frames per chunk of 16 encoder frames
STRIDE = 64


def chunk_windows(num_frames: int) -> list[tuple[int, int]]:
    """[start, end) fbank windows of chunk-16 streaming (the last one may be short, >= 7)."""
    return [(s, min(s + WINDOW, num_frames)) for s in range(0, num_frames - 7 + 1, STRIDE)]


def run_forward_chunk(model, feats: torch.Tensor, required_cache_size: int) -> torch.Tensor:
    """Dense chunk-by-chunk streaming of one (T, 80) utterance -> (T', D)."""
    att, cnn, offset, outs = None, None, 0, []
    with torch.no_grad():
        for start, end in chunk_windows(feats.size(0)):
            y, att, cnn = model.encoder.forward_chunk(
                feats[start:end].unsqueeze(0), offset, required_cache_size, att, cnn
            )
            offset += y.size(1)
            outs.append(y[0])
    return torch.cat(outs, dim=0)


class PagedHarness:
    """What the engine does around ``forward_chunk_paged``: a real BlockPool and
    AttentionCacheManager, a slot-addressed conv-state buffer, per-stream offsets."""

    def __init__(self, model, num_left_chunks: int, max_batch_size: int = 4,
                 max_num_blocks: int = 64, max_blocks_per_seq: int = 16,
                 dtype: torch.dtype = torch.float32) -> None:
        from oasr.cache import AttentionCacheManager, BlockPool, CacheConfig

        cfg = model.config
        self.model = model
        self.cache_config = CacheConfig(
            num_layers=cfg.num_blocks, n_kv_head=cfg.attention_heads, head_dim=cfg.head_dim,
            hidden_dim=cfg.output_size, kernel_size=cfg.cnn_module_kernel, chunk_size=16,
            num_left_chunks=num_left_chunks, block_size_frames=16, max_num_blocks=max_num_blocks,
            max_blocks_per_seq=max_blocks_per_seq, max_batch_size=max_batch_size,
            device=torch.device("cpu"), dtype=dtype,
        )
        self.pool = BlockPool(self.cache_config)
        self.manager = AttentionCacheManager(self.pool, self.cache_config)
        self.cnn = torch.zeros(
            cfg.num_blocks, max_batch_size, cfg.cnn_cache_frames, cfg.output_size, dtype=dtype
        )
        self.offsets: dict[int, int] = {}

    def add(self, sid: int) -> None:
        slot = self.manager.allocate_stream(sid)
        self.cnn[:, slot] = 0.0
        self.offsets[sid] = 0

    def free(self, sid: int) -> None:
        self.manager.free_stream(sid)
        del self.offsets[sid]

    def step(self, chunks: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Run one batched chunk: {sid: (T_b, 80) window} -> {sid: (T'_b, D) output}."""
        sids = list(chunks)
        self.manager.prepare_chunks_batched(sids)
        caches = self.manager.get_batched_paged_caches(sids)
        slots = torch.tensor([self.manager.slot_of(s) for s in sids])
        lens = torch.tensor([chunks[s].size(0) for s in sids])
        xs = torch.zeros(len(sids), int(lens.max()), chunks[sids[0]].size(1))
        for i, s in enumerate(sids):
            xs[i, : lens[i]] = chunks[s]
        offsets = torch.tensor([self.offsets[s] for s in sids], dtype=torch.int64)
        with torch.no_grad():
            ys, ys_lens, new_cnn = self.model.encoder.forward_chunk_paged(
                xs, lens, offsets, caches, self.cnn[:, slots]
            )
        self.cnn[:, slots] = new_cnn
        out = {}
        for i, s in enumerate(sids):
            n = int(ys_lens[i])
            self.manager.commit_chunk_paged(s, n)
            self.offsets[s] += n
            out[s] = ys[i, :n]
        return out


def run_paged_alone(model, feats: torch.Tensor, num_left_chunks: int, **kw) -> torch.Tensor:
    """One stream through the paged path, one chunk per call -> (T', D)."""
    harness = PagedHarness(model, num_left_chunks, **kw)
    harness.add(0)
    outs = [harness.step({0: feats[s:e]})[0] for s, e in chunk_windows(feats.size(0))]
    return torch.cat(outs, dim=0)
