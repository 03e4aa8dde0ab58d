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


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wordnet_lemmas(wordnet_dir: Path = Path("/usr/share/wordnet")) -> list[str]:
    """WordNet's lemmas (index.noun/verb/adj/adv), lowercase letters and apostrophes only,
    underscores as spaces; one per line."""
    import re

    keep = re.compile(r"^[a-z' ]+$")
    lemmas = set()
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (wordnet_dir / f"index.{pos}").read_text(encoding="latin-1").splitlines():
            if line and not line.startswith(" "):
                lemma = line.split(" ", 1)[0].replace("_", " ")
                if keep.match(lemma):
                    lemmas.add(lemma)
    return sorted(lemmas)


def build(order: int, min_context_count: int, smoothing: str, with_lemmas: bool,
          out: Path) -> Path:
    """Build the LM from the training text (+ WordNet lemmas) and write it to ``out``."""
    from oasr.lm import LmBuildConfig, build_char_lm, encode_sentences
    from oasr.models.bundled import BUNDLED_UNITS

    texts = read_lines(TRAIN_TEXT)
    source = f"{TRAIN_TEXT.name}: {len(texts)} WordNet example sentences"
    if with_lemmas:
        lemmas = wordnet_lemmas()
        texts += lemmas
        source += f" + {len(lemmas)} WordNet lemmas"
    config = LmBuildConfig(order=order, smoothing=smoothing, min_context_count=min_context_count,
                           text=f"{source} (WordNet 3.0 licence, Princeton University)")
    lm = build_char_lm(encode_sentences(texts, BUNDLED_UNITS), BUNDLED_UNITS, config)
    path = lm.save(out)
    print(f"{path}: order {order}, {lm.num_states} states, {path.stat().st_size / 1e6:.2f} MB")
    return path


def decode_set(rows: list, beam: int, lm: object | None = None, lm_weight: float = 0.0,
               unit_bonus: float = 0.0, word_bonus: float = 0.0) -> tuple[float, float]:
    """(WER, CER) of one dumped set: greedy (beam 1) or beam search, with an optional LM; all
    utterances in one batched decoder call."""
    from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
    from oasr.decoding.tokenizer import CharTokenizer
    from oasr.metrics import ErrorCounts
    from oasr.models.bundled import BUNDLED_UNITS

    config = GpuDecoderConfig(beam_size=beam, lm_weight=lm_weight, lm_unit_bonus=unit_bonus,
                              lm_word_bonus=word_bonus)
    decoder = GpuStreamingDecoder(config, CharTokenizer.from_units(list(BUNDLED_UNITS)),
                                  device="cpu", lm=lm if beam > 1 else None)  # type: ignore[arg-type]
    lengths = torch.tensor([len(lp) for _, lp, _ in rows])
    padded = torch.nn.utils.rnn.pad_sequence([lp for _, lp, _ in rows], batch_first=True)
    state = decoder.create_state(len(rows), padded.shape[-1])
    decoder.decode_chunk(padded, state, lengths)
    counts = ErrorCounts()
    for b, (_, _, ref) in enumerate(rows):
        counts.add(ref, decoder.finalize_stream(state, b)[0].text)
    return counts.wer, counts.cer
