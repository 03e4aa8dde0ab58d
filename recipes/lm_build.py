"""Character n-gram LM for the Whisper-CTC model: build it, dump log-probs, tune, report.

Stages (``python -m recipes.lm_build STAGE``):

- ``build``: count the training text (``/work/data/text/train.txt``, the acoustic training
  sentences; optionally WordNet lemmas), smooth, prune and write ``char_lm.safetensors`` +
  ``char_lm.json`` (see `oasr.lm`).
- ``dump``: chunk-32 streaming log-probs of a checkpoint on the test sets (heldout_sentences,
  heldout_voices, devset tts / real), saved once so tuning never reruns the encoder.
- ``tune``: greedy / beam / beam + LM WER and CER over a grid of LM weights and bonuses on the
  dumped ``heldout_sentences`` log-probs (the only set used for choosing settings).
- ``report``: the chosen settings on every set, as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

LM_DIR = Path("/work/data/lm")
TRAIN_TEXT = Path("/work/data/text/train.txt")
SETS = ("heldout_sentences", "heldout_voices", "devset_tts", "devset_real")


def dump_log_probs(ckpt: Path, out: Path, heldout_limit: int = 1000) -> None:
    """Save {set: [(name, (T, V) float32 log-probs, reference)]} of chunk-32 streaming."""
    from recipes.wctc_evaluate import DEVSET, load_for_eval, log_probs_of, test_sets
    from recipes.wctc_train import DATA

    model, state = load_for_eval(ckpt)
    sets = test_sets(DEVSET, DATA / "feats", heldout_limit)
    dumped: dict[str, list] = {}
    for name, utts in sets.items():
        rows = []
        for start in range(0, len(utts), 16):
            group = utts[start:start + 16]
            log_probs, lens = log_probs_of(model, group, 32)
            for b, (utt, _, ref) in enumerate(group):
                rows.append((utt, log_probs[b, : int(lens[b])].clone(), ref))
        dumped[name] = rows
        print(f"{name}: {len(rows)} utterances", flush=True)
    torch.save({"ckpt": str(ckpt), "step": state.get("step"), "sets": dumped}, out)
