"""Stage 5: greedy-CTC WER of a checkpoint on the test sets, streaming and full context.

Test sets: the synthetic (``tts_*``) and real (``real_*``) files of ``tests/data/audio/devset``, and
the recipe's ``heldout_sentences`` / ``heldout_voices`` splits. Modes:

- ``chunk16``: the chunk-masked full forward (chunk 16 = 640 ms, unbounded history), which
  equals chunk-by-chunk decoding;
- ``stream16`` (devset only): true chunk-by-chunk decoding through ``forward_chunk`` with the
  serving windows (67 fbank frames, stride 64), as a check of that equality;
- ``full``: no chunk mask (full context).

Writes ``<out>.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from oasr.audio.chunking import ChunkGeometry, split_windows
from oasr.audio.fbank import compute_fbank
from oasr.audio.wav import read_audio
from oasr.models import AsrModel, ConformerConfig, load_model
from recipes.data import FeatureSet
from recipes.paths import DATA_ROOT
from recipes.text import TEST_AUDIO_ROOT
from recipes.wer import ErrorCounts, decode_batch, greedy_ctc

MODES = {"chunk16": 16, "full": -1}


def load_for_eval(source: Path) -> tuple[AsrModel, dict]:
    """A model from a training checkpoint (``.pt``) or an oasr/WeNet model dir; eval mode."""
    if source.suffix == ".pt":
        payload = torch.load(source, map_location="cpu", weights_only=False)
        model = AsrModel(ConformerConfig.from_dict(payload["model_config"]), units=payload["units"])
        model.load_state_dict(payload["model"])
        return model.eval(), dict(payload["state"])
    return load_model(source), {}


def devset_utterances(devset: Path, prefix: str) -> list[tuple[str, np.ndarray, str]]:
    """(name, (T, 80) fbank, reference) for devset files whose name starts with ``prefix``."""
    out = []
    for line in (devset / "manifest.tsv").read_text(encoding="utf-8").splitlines():
        name, text = line.split("\t", 1)
        if name.startswith(prefix):
            out.append((name, compute_fbank(read_audio(devset / name)), text.strip()))
    return out


def heldout_utterances(feats_dir: Path, split: str, limit: int) -> list[tuple[str, np.ndarray, str]]:
    fs = FeatureSet(feats_dir, split, lambda t: [0], max_utt_frames=100000)
    return [(fs.ids[i], fs.features(i), fs.texts[i]) for i in range(min(limit, len(fs)))]


def score_masked(model: AsrModel, utts: list[tuple[str, np.ndarray, str]], chunk: int,
                 batch_size: int = 16) -> ErrorCounts:
    """WER with the (chunk-masked) full forward, batched by length."""
    counts = ErrorCounts()
    order = sorted(range(len(utts)), key=lambda i: len(utts[i][1]))
    for start in range(0, len(order), batch_size):
        group = [utts[i] for i in order[start:start + batch_size]]
        lens = [len(f) for _, f, _ in group]
        padded = np.zeros((len(group), max(lens), 80), np.float32)
        for b, (_, f, _) in enumerate(group):
            padded[b, : len(f)] = f
        hyps = decode_batch(model, torch.from_numpy(padded), torch.tensor(lens), chunk)
        for (_, _, ref), hyp in zip(group, hyps, strict=True):
            counts.add(ref, hyp)
    return counts


@torch.no_grad()
def stream_transcript(model: AsrModel, feats: np.ndarray, chunk: int = 16) -> str:
    """Chunk-by-chunk greedy transcript of one utterance (unbounded history)."""
    enc = model.encoder
    att = torch.zeros(0, 0, 0, 0)
    cnn = torch.zeros(0, 0, 0, 0)
    offset, outputs = 0, []
    for window in split_windows(feats, ChunkGeometry(chunk_size=chunk)):
        xs = torch.from_numpy(np.ascontiguousarray(window)).unsqueeze(0)  # (1, T, 80)
        ys, att, cnn = enc.forward_chunk(xs, offset, -1, att, cnn)  # ys: (1, T', D)
        offset += ys.size(1)
        outputs.append(ys)
    if not outputs:
        return ""
    ys = torch.cat(outputs, dim=1)
    ids = greedy_ctc(model.ctc_log_probs(ys), torch.tensor([ys.size(1)]))
    return model.tokenizer.decode(ids[0])


def score_streaming(model: AsrModel, utts: list[tuple[str, np.ndarray, str]]) -> ErrorCounts:
    counts = ErrorCounts()
    for _, feats, ref in utts:
        counts.add(ref, stream_transcript(model, feats))
    return counts


def evaluate(source: Path, devset: Path, feats_dir: Path, heldout_limit: int,
             num_threads: int = 1) -> dict:
    """All test sets x modes -> {"sets": {set: {mode: {wer, cer, words, utts}}}, ...}."""
    torch.set_num_threads(num_threads)
    model, train_state = load_for_eval(source)
    sets = {
        "devset_tts": devset_utterances(devset, "tts_"),
        "devset_real": devset_utterances(devset, "real_"),
    }
    for split in ("heldout_sentences", "heldout_voices"):
        if (feats_dir / f"{split}.tsv").exists():
            sets[split] = heldout_utterances(feats_dir, split, heldout_limit)
    results: dict[str, dict] = {}
    for name, utts in sets.items():
        modes = {mode: score_masked(model, utts, chunk) for mode, chunk in MODES.items()}
        if name.startswith("devset"):
            modes["stream16"] = score_streaming(model, utts)
        results[name] = {m: {"wer": round(c.wer, 2), "cer": round(c.cer, 2), "words": c.words,
                             "utts": c.utterances} for m, c in modes.items()}
    return {"source": str(source), "train_state": train_state, "sets": results,
            "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def markdown_table(report: dict) -> str:
    """The WER table of ``report`` as markdown (WER %, CER % in parentheses)."""
    lines = ["| test set | utts | words | chunk16 WER (CER) | stream16 WER | full WER (CER) | gap |",
             "|---|---|---|---|---|---|---|"]
    for name, modes in report["sets"].items():
        c, f = modes["chunk16"], modes["full"]
        stream = f"{modes['stream16']['wer']:.1f}" if "stream16" in modes else "-"
        lines.append(f"| {name} | {c['utts']} | {c['words']} | {c['wer']:.1f} ({c['cer']:.1f}) | "
                     f"{stream} | {f['wer']:.1f} ({f['cer']:.1f}) | {c['wer'] - f['wer']:+.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="training checkpoint .pt or model dir")
    parser.add_argument("--devset", type=Path, default=TEST_AUDIO_ROOT / "devset")
    parser.add_argument("--feats", type=Path, default=DATA_ROOT / "feats")
    parser.add_argument("--heldout-limit", type=int, default=300)
    parser.add_argument("--out", type=Path, default=DATA_ROOT / "eval/latest")
    args = parser.parse_args(argv)
    report = evaluate(args.source, args.devset, args.feats, args.heldout_limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(markdown_table(report))


if __name__ == "__main__":
    main()
