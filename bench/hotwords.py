"""Hotwords and live word times: before/after figures in one run.

1. Names: the sentences of ``bench/data/hotword_sentences.tsv`` (set ``eval``: 24 invented
   names, each sentence spoken by two voices, `bench/hotword_audio.py`), transcribed without
   hotwords and with each round's 12 names as hotwords; how many names the finals spell right
   (whole word, any case) and the sentences' WER.
2. Unrelated hotwords: the devset's real recordings (``tests/data/audio/devset/real_*``)
   without hotwords and with 20 terms that occur nowhere in them; the WER of each.
3. Word times: every final's words (the run without hotwords on the devset) against a CTC
   forced alignment of the reference text over the whole file (the same CTC model, full
   context): each word's start and end inside its final, in order, and the median of the
   larger of its start and end deviation over the words the final spelled as the reference.

Everything runs through the engine as ``oasr transcribe`` configures it (second pass on,
every segment's final from Whisper unless the guard keeps the CTC text; ``--second-pass
none`` gives the first pass alone).

    python bench/hotword_audio.py --out /tmp/oasr_hotwords
    python bench/hotwords.py --audio /tmp/oasr_hotwords --out bench/results_hotwords.json
"""

from __future__ import annotations

import argparse
import csv
import difflib
import itertools
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oasr.audio import read_audio
from oasr.benchmarks.workload import DEVSET_DIR
from oasr.decoding.context import Hotwords
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.engine import ASREngine
from oasr.engine.events import Final, Partial, StreamEvent
from oasr.engine.options import (
    OFFLINE_FINAL_CONTEXT_S,
    add_engine_arguments,
    engine_config_from_args,
)
from oasr.text.wer import ErrorCounts, normalize_transcript

_STREAM_IDS = itertools.count(1)
ROUND = 12  # names given together as one stream's hotwords
# terms that occur nowhere in the devset's real recordings
UNRELATED = ["Kubernetes", "Brenvik", "Quenmarsh", "Taloria", "Zadorin", "Ostrevan",
             "Pellandro", "Tarquell", "Fenwycke", "Ildrasso", "Ljubljana", "Oyelaran",
             "Corvantis", "Halvenor", "Sibrenna", "Marrowick", "Jostavel", "Truvallo",
             "Nembrecht", "Varnholt"]


@dataclass
class FileRun:
    """One file's events: its finals (and their words) and its partials' words."""

    finals: list[Final] = field(default_factory=list)
    partials: list[Partial] = field(default_factory=list)

    def sink(self, event: StreamEvent) -> None:
        if isinstance(event, Final):
            self.finals.append(event)
        elif isinstance(event, Partial):
            self.partials.append(event)

    @property
    def text(self) -> str:
        return " ".join(f.text for f in self.finals if f.text)


def run_files(engine: ASREngine, files: list[Path], hotwords: list[str]) -> list[FileRun]:
    """The files as concurrent streams of ``engine``, each with ``hotwords``."""
    bias = Hotwords.build(hotwords, engine.resources.hotword_tokenizer) if hotwords else None
    runs = [FileRun() for _ in files]
    for path, run in zip(files, runs, strict=True):
        stream_id = next(_STREAM_IDS)
        engine.submit(OpenStream(stream_id, run.sink, hotwords=bias))
        engine.submit(AppendAudio(stream_id, read_audio(path)))
        engine.submit(EndStream(stream_id))
    while True:
        if not engine.step():
            engine.wait_for_work(0.05)
        if engine.is_idle:
            return runs


def words_of(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(texts: list[str], refs: list[str]) -> float:
    counts = ErrorCounts()
    for text, ref in zip(texts, refs, strict=True):
        counts.add(normalize_transcript(ref), normalize_transcript(text))
    return round(counts.wer, 2)


# -- 1. names ---------------------------------------------------------------------------------
def names_figures(engine: ASREngine, audio: Path, kind: str) -> dict[str, Any]:
    rows = [r for r in csv.reader((audio / "manifest.tsv").open(), delimiter="\t")
            if r[1] == kind]
    names = list(dict.fromkeys(r[2] for r in rows))
    rounds = [names[i:i + ROUND] for i in range(0, len(names), ROUND)]
    out: dict[str, Any] = {"files": len(rows), "names": len(names), "rounds": len(rounds)}
    for label, use in (("without", False), ("with", True)):
        texts: dict[str, str] = {}
        for terms in rounds:
            mine = [r for r in rows if r[2] in terms]
            runs = run_files(engine, [audio / r[0] for r in mine], terms if use else [])
            texts.update({r[0]: run.text for r, run in zip(mine, runs, strict=True)})
        right = [r[2].lower() in words_of(texts[r[0]]) for r in rows]
        per_round = [sum(ok for r, ok in zip(rows, right, strict=True) if r[2] in terms)
                     for terms in rounds]
        out[label] = {"names_right": sum(right), "of": len(rows),
                      "per_12": round(12 * sum(right) / len(rows), 2),
                      "right_per_round_of_2x12": per_round,
                      "wer": wer([texts[r[0]] for r in rows], [r[4] for r in rows]),
                      "texts": {r[0]: texts[r[0]] for r in rows}}
    return out


# -- 2 and 3. the devset -----------------------------------------------------------------------
def devset_files(devset: Path) -> tuple[list[Path], list[str]]:
    refs = dict(line.split("\t", 1) for line in
                (devset / "manifest.tsv").read_text().splitlines() if line.strip())
    names = sorted(n for n in refs if n.startswith("real_"))
    return [devset / n for n in names], [refs[n].strip() for n in names]


def forced_alignment(log_probs: np.ndarray, tokens: list[int], blank: int) -> list[tuple[int, int]]:
    """Viterbi CTC alignment of ``tokens`` over ``log_probs`` (T, V): each token's first and
    last frame."""
    frames = log_probs.shape[0]
    labels = [blank]
    for t in tokens:
        labels += [t, blank]
    n = len(labels)
    lab = np.array(labels)
    emit = log_probs[:, lab]  # (T, S)
    skip = np.zeros(n, dtype=bool)
    for s in range(2, n):
        skip[s] = labels[s] != blank and labels[s] != labels[s - 2]
    score = np.full(n, -np.inf)
    score[0], score[1] = emit[0, 0], emit[0, 1]
    back = np.zeros((frames, n), dtype=np.int8)
    for t in range(1, frames):
        stay = score
        step = np.concatenate([[-np.inf], score[:-1]])
        jump = np.where(skip, np.concatenate([[-np.inf, -np.inf], score[:-2]]), -np.inf)
        stacked = np.stack([stay, step, jump])
        back[t] = stacked.argmax(axis=0)
        score = stacked.max(axis=0) + emit[t]
    s = n - 1 if score[n - 1] >= score[n - 2] else n - 2
    path = [s]
    for t in range(frames - 1, 0, -1):
        s -= int(back[t, s])
        path.append(s)
    path.reverse()
    spans: list[list[int]] = [[] for _ in tokens]
    for t, s in enumerate(path):
        if s % 2 == 1:
            spans[s // 2].append(t)
    return [(min(f), max(f)) for f in spans]


def reference_word_times(engine: ASREngine, path: Path, ref: str) -> list[tuple[str, float, float]]:
    """The reference's words timed by a forced alignment over the file's CTC log-probs (the
    model's full-context forward under its chunk mask)."""
    family = engine.resources.family
    model = family.model
    tokenizer = family.tokenizer
    audio = read_audio(path)
    features = family.new_features()
    features.accept_waveform(audio)
    features.input_finished()
    feats = torch.as_tensor(features.get_frames(0, features.num_frames_ready))
    chunk = engine.resources.chunk_size
    with torch.inference_mode():
        param = next(model.parameters())
        mel = feats[None].to(device=param.device, dtype=param.dtype)
        log_probs, _ = model(mel, torch.tensor([mel.shape[1]]), chunk)
    lp = log_probs[0].float().cpu().numpy()
    words = ref.split()
    tokens = tokenizer.encode(" ".join(words))
    spans = forced_alignment(lp, tokens, tokenizer.blank_id)
    shift = family.timing.frame_shift_s
    out, at = [], 0
    for word in words:
        first, last = spans[at][0], spans[at + len(word) - 1][1]
        out.append((word, first * shift, (last + 1) * shift))
        at += len(word) + 1  # the boundary unit after it
    return out


def word_time_figures(engine: ASREngine, files: list[Path], refs: list[str],
                      runs: list[FileRun]) -> dict[str, Any]:
    deviations: list[float] = []
    outside = disorder = words = partial_words = partial_bad = 0
    for path, ref, run in zip(files, refs, runs, strict=True):
        timed = [(w, f) for f in run.finals for w in f.words]
        for final in run.finals:
            last_end = final.start
            for w in final.words:
                words += 1
                outside += not (final.start - 1e-6 <= w.start <= w.end <= final.end + 1e-6)
                disorder += w.start < last_end - 1e-6
                last_end = w.end
        for partial in run.partials:
            last_end = 0.0
            for w in partial.words:
                partial_words += 1
                partial_bad += w.start < last_end - 1e-6 or w.end > partial.end + 1e-6
                last_end = w.end
        reference = reference_word_times(engine, path, ref)
        hyp_keys = [normalize_transcript(w.word) for w, _ in timed]
        ref_keys = [normalize_transcript(w) for w, _, _ in reference]
        matcher = difflib.SequenceMatcher(a=hyp_keys, b=ref_keys, autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                w = timed[block.a + k][0]
                _, start, end = reference[block.b + k]
                deviations.append(max(abs(w.start - start), abs(w.end - end)))
    return {"final_words": words, "outside_their_final": outside, "out_of_order": disorder,
            "partial_words": partial_words, "partial_words_out_of_order_or_late": partial_bad,
            "matched_words": len(deviations),
            "median_deviation_s": round(statistics.median(deviations), 3) if deviations else None,
            "p90_deviation_s": round(float(np.percentile(deviations, 90)), 3)
            if deviations else None,
            "within_0.3_s": round(sum(d <= 0.3 for d in deviations) / max(1, len(deviations)), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--audio", type=Path, default=Path("/tmp/oasr_hotwords"),
                   help="bench/hotword_audio.py's output folder")
    p.add_argument("--set", default="eval", choices=("eval", "tune"))
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    if not (args.audio / "manifest.tsv").is_file():
        print(f"no {args.audio}/manifest.tsv: run bench/hotword_audio.py --out {args.audio}",
              file=sys.stderr)
        return 2
    config = engine_config_from_args(
        args, max_wait_time_s=math.inf, idle_timeout_s=math.inf, max_session_s=math.inf,
        max_pending_audio_s=math.inf, second_pass_max_backlog=sys.maxsize, min_audio_rate=0.0,
        second_pass_fast_backlog=None, second_pass_yield_s=None,
        final_context_s=OFFLINE_FINAL_CONTEXT_S if args.final_context is None
        else args.final_context, light_load_context_s=0.0, early_final_s=0.0, refine=None)
    engine = ASREngine(config)
    started = time.perf_counter()
    try:
        result: dict[str, Any] = {"config": {"second_pass": config.second_pass,
                                             "beam_size": config.decoder.beam_size}}
        result["names"] = names_figures(engine, args.audio, args.set)
        files, refs = devset_files(args.devset)
        plain = run_files(engine, files, [])
        biased = run_files(engine, files, UNRELATED)
        result["devset_unrelated_hotwords"] = {
            "files": len(files), "hotwords": UNRELATED,
            "wer_without": wer([r.text for r in plain], refs),
            "wer_with": wer([r.text for r in biased], refs)}
        result["word_times"] = word_time_figures(engine, files, refs, plain)
    finally:
        engine.shutdown()
    result["seconds"] = round(time.perf_counter() - started, 1)
    names = result["names"]
    print(f"names right ({args.set}, {names['files']} files): without hotwords "
          f"{names['without']['names_right']}/{names['without']['of']} "
          f"({names['without']['per_12']} of 12), with "
          f"{names['with']['names_right']}/{names['with']['of']} ({names['with']['per_12']} of 12)")
    print(f"sentences' WER: without {names['without']['wer']} %, with {names['with']['wer']} %")
    dev = result["devset_unrelated_hotwords"]
    print(f"devset real WER: without {dev['wer_without']} %, with 20 unrelated hotwords "
          f"{dev['wer_with']} %")
    times = result["word_times"]
    print(f"word times: {times['final_words']} final words, {times['outside_their_final']} "
          f"outside their final, {times['out_of_order']} out of order; median deviation "
          f"{times['median_deviation_s']} s from a forced alignment over "
          f"{times['matched_words']} words (p90 {times['p90_deviation_s']} s)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
