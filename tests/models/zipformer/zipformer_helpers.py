"""Helpers of the icefall Zipformer2 tests: the fixture model and icefall's decode loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch
from support.paths import ZIPFORMER_FIXTURE_DIR
from torch import Tensor

from oasr.models.zipformer import LOG_EPS, ZipformerModel, load_icefall_dir

torch.set_num_threads(1)

TAIL_PAD = 30  # icefall's decode_dataset: set_features(tail_pad_len=30)
PAD_LENGTH = 13  # DecodeStream.pad_length = 7 + 2 * 3


@cache
def fixture_model(chunk_size: int, left_context_frames: int) -> ZipformerModel:
    return load_icefall_dir(ZIPFORMER_FIXTURE_DIR, chunk_size, left_context_frames)


def utterances(ref: dict[str, np.ndarray]) -> list[Tensor]:
    """The fixture's utterances without batch padding: (T_i, 80) each."""
    feats = torch.from_numpy(ref["feats"])
    return [feats[i, : int(n)] for i, n in enumerate(ref["feats_lens"])]


@dataclass
class StreamRecord:
    """One utterance's streaming outputs: per-call encoder output and valid lengths."""

    chunks: list[Tensor] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    states_after_first: dict[str, Tensor] | None = None


def select_rows(model: ZipformerModel, states: dict[str, Tensor], rows: list[int]) -> dict[str, Tensor]:
    index = torch.tensor(rows, dtype=torch.int64)
    return {s.name: states[s.name].index_select(s.slot_axis, index) for s in model.state_specs()}


def icefall_decode_loop(model: ZipformerModel, utts: list[Tensor]) -> list[StreamRecord]:
    """icefall's streaming_decode loop (DecodeStream + decode_one_chunk): every stream hands
    over features[p : p + 2 * chunk + 13] and advances 2 * chunk; windows padded with LOG_EPS to
    the longest, all padded to the full window (and counted) when even the longest is short;
    finished streams leave the batch. States are the named ones, batch on each spec's axis."""
    chunk = model.config.chunk_size
    width = model.config.window_frames
    feats = [torch.cat([u, torch.full((PAD_LENGTH + TAIL_PAD, u.shape[1]), LOG_EPS)]) for u in utts]
    pos = [0] * len(utts)
    records = [StreamRecord() for _ in utts]
    active = list(range(len(utts)))
    states = model.init_states(len(utts))
    with torch.no_grad():
        while active:
            windows = [feats[i][pos[i] : pos[i] + width] for i in active]
            lens = torch.tensor([w.shape[0] for w in windows])
            longest = max(width, int(lens.max()))
            if int(lens.max()) < width:
                lens += width - int(lens.max())
            batch = torch.stack([torch.cat([w, torch.full((longest - w.shape[0], w.shape[1]), LOG_EPS)])
                                 for w in windows])
            out, out_lens, states = model.streaming_step(batch, lens, states)
            for row, i in enumerate(active):
                records[i].chunks.append(out[row])
                records[i].lens.append(int(out_lens[row]))
                if records[i].states_after_first is None:
                    records[i].states_after_first = select_rows(model, states, [row])
                pos[i] += 2 * chunk
            keep = [row for row, i in enumerate(active) if pos[i] < feats[i].shape[0]]
            active = [active[row] for row in keep]
            states = select_rows(model, states, keep)
    return records
