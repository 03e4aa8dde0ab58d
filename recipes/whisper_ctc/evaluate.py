"""Whisper-CTC evaluation: WER / CER of chunk-32 streaming and full-context decoding.

``python -m recipes.whisper_ctc.evaluate --ckpt CKPT_OR_MODEL_DIR`` scores a training checkpoint
(``.pt``) or an exported model dir on four test sets: the synthetic (``tts_*``) and real
(``real_*``) files of ``tests/data/audio/devset``, and the recipe's ``heldout_sentences`` and
``heldout_voices`` splits (causal log-mel features from ``recipes.whisper_ctc.feats``). Modes:

- ``chunk32``: ``forward(..., chunk_frames=32)`` (640 ms chunks, unbounded history), which the
  streaming contract makes equal to chunk-by-chunk serving;
- ``full``: no chunk mask (full context).

Greedy CTC by default; ``--beam N`` adds CTC prefix beam search (``oasr.decoding``) of the
chunk-32 log-probs. Writes ``<out>/<name>.json`` and appends a markdown row per set to
``<logs>/eval_trend.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from oasr.audio.wav import read_audio
from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.models.whisper_ctc import WhisperCtcModel, causal_log_mel, load_whisper_ctc_dir
from oasr.text.tokenizer import CharTokenizer
from oasr.text.wer import ErrorCounts
from recipes.data import FeatureSet
from recipes.text import TEST_AUDIO_ROOT
from recipes.wer import greedy_ctc
from recipes.whisper_ctc.train import DATA, UNITS, load_checkpoint_model

DEVSET = TEST_AUDIO_ROOT / "devset"
MODES = {"chunk32": 32, "full": -1}
Utterance = tuple[str, np.ndarray, str]  # (name, (T, 80) log-mel, reference)


def load_for_eval(source: Path) -> tuple[WhisperCtcModel, dict]:
    """A model (eval mode) and its training state from a ``.pt`` checkpoint or a model dir."""
    if source.suffix == ".pt":
        model, payload = load_checkpoint_model(source)
        return model, dict(payload["state"])
    return load_whisper_ctc_dir(source), {}


def devset_utterances(devset: Path, prefix: str, lead_silence_s: float = 0.0) -> list[Utterance]:
    """Devset files whose name starts with ``prefix``, as causal log-mel; ``lead_silence_s`` of
    digital silence goes before each file (it moves every chunk boundary)."""
    pad = np.zeros(int(round(lead_silence_s * 16000)), np.float32)
    out = []
    for line in (devset / "manifest.tsv").read_text(encoding="utf-8").splitlines():
        name, text = line.split("\t", 1)
        if name.startswith(prefix):
            audio = np.concatenate([pad, read_audio(devset / name).astype(np.float32)])
            out.append((name, causal_log_mel(audio), text.strip()))
    return out


def heldout_utterances(feats_dir: Path, split: str, limit: int) -> list[Utterance]:
    data = FeatureSet(feats_dir, split, lambda t: [0], max_utt_frames=100_000)
    return [(data.ids[i], data.features(i), data.texts[i]) for i in range(min(limit, len(data)))]


@torch.no_grad()
def log_probs_of(model: WhisperCtcModel, group: list[Utterance], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded batch of ``group`` -> (log_probs (B, T', V), lengths (B,))."""
    lens = [len(f) for _, f, _ in group]
    padded = np.zeros((len(group), max(lens), 80), np.float32)
    for b, (_, f, _) in enumerate(group):
        padded[b, : len(f)] = f
    return model(torch.from_numpy(padded), torch.tensor(lens), chunk)


@torch.no_grad()
def chunked_rows(model: WhisperCtcModel, utts: list, chunk: int = 32,
                 group_size: int = 16) -> list[tuple[str, torch.Tensor, str]]:
    """(name, (T', V) log-probs, reference) of every utterance, chunk-masked forward."""
    rows = []
    for start in range(0, len(utts), group_size):
        group = utts[start:start + group_size]
        log_probs, lens = log_probs_of(model, group, chunk)
        rows += [(name, log_probs[b, : int(lens[b])].clone(), ref)
                 for b, (name, _, ref) in enumerate(group)]
    return rows


def beam_texts(log_probs: torch.Tensor, lengths: torch.Tensor, beam: int,
               tokenizer: CharTokenizer) -> list[str]:
    """CTC prefix beam search (no LM) of each row; the best hypothesis's text."""
    decoder = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam), tokenizer, device="cpu")
    texts = []
    for row in range(log_probs.size(0)):
        state = decoder.create_state(1, log_probs.size(-1))
        decoder.decode_chunk(log_probs[row:row + 1, : int(lengths[row])], state)
        texts.append(decoder.finalize_stream(state)[0].text)
    return texts


def score(model: WhisperCtcModel, utts: list[Utterance], chunk: int, beam: int = 1,
          batch_size: int = 16) -> ErrorCounts:
    """Error counts of one mode on one set, batched by length."""
    tokenizer = CharTokenizer.from_units(UNITS)
    counts = ErrorCounts()
    order = sorted(range(len(utts)), key=lambda i: len(utts[i][1]))
    for start in range(0, len(order), batch_size):
        group = [utts[i] for i in order[start:start + batch_size]]
        log_probs, lens = log_probs_of(model, group, chunk)
        if beam > 1:
            hyps = beam_texts(log_probs, lens, beam, tokenizer)
        else:
            hyps = [tokenizer.decode(ids) for ids in greedy_ctc(log_probs, lens)]
        for (_, _, ref), hyp in zip(group, hyps, strict=True):
            counts.add(ref, hyp)
    return counts


def test_sets(devset: Path, feats_dir: Path, heldout_limit: int) -> dict[str, list[Utterance]]:
    sets = {"devset_tts": devset_utterances(devset, "tts_"),
            "devset_real": devset_utterances(devset, "real_")}
    for split in ("heldout_sentences", "heldout_voices"):
        sets[split] = heldout_utterances(feats_dir, split, heldout_limit)
    return sets


def evaluate(source: Path, sets: dict[str, list[Utterance]], beam: int = 1) -> dict:
    """All sets x modes -> {"sets": {set: {mode: {wer, cer, words, utts}}}, ...}."""
    model, train_state = load_for_eval(source)
    results: dict[str, dict] = {}
    for name, utts in sets.items():
        modes = {mode: score(model, utts, chunk) for mode, chunk in MODES.items()}
        if beam > 1:
            modes[f"chunk32_beam{beam}"] = score(model, utts, 32, beam)
        results[name] = {m: {"wer": round(c.wer, 2), "cer": round(c.cer, 2), "words": c.words,
                             "utts": c.utterances} for m, c in modes.items()}
    return {"source": str(source), "step": train_state.get("step"),
            "audio_hours_seen": round(train_state.get("audio_seconds", 0.0) / 3600, 2),
            "sets": results, "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def markdown_rows(report: dict) -> list[str]:
    """One row per test set: WER (CER) of each mode."""
    rows = []
    source = Path(report["source"])
    label = f"{source.parent.name}/{source.name}"
    for name, modes in report["sets"].items():
        cells = " | ".join(f"{m} {v['wer']:.1f} ({v['cer']:.1f})" for m, v in modes.items())
        rows.append(f"| {report['time'][11:19]} | {label} step {report['step']} | {name} | {cells} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="training .pt or model dir")
    parser.add_argument("--devset", type=Path, default=DEVSET)
    parser.add_argument("--feats", type=Path, default=DATA / "feats")
    parser.add_argument("--heldout-limit", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=1, help="> 1 adds prefix beam search")
    parser.add_argument("--out", type=Path, default=DATA / "eval")
    parser.add_argument("--logs", type=Path, default=DATA / "logs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    report = evaluate(args.ckpt, test_sets(args.devset, args.feats, args.heldout_limit), args.beam)
    report["eval_seconds"] = round(time.time() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.ckpt.stem if args.ckpt.suffix == ".pt" else args.ckpt.name
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    rows = markdown_rows(report)
    args.logs.mkdir(parents=True, exist_ok=True)
    with open(args.logs / "eval_trend.md", "a", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows) + f"\n({report['eval_seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
