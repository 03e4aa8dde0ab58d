"""Where segments end versus where sentences end, on long read passages.

Runs every passage of `bench/read_passages.py` through one engine (CTC finals, second pass
off: the endpoints do not depend on it) and reports, per set (real / tts): segments, their
length (median, max), cuts that fall inside a sentence, one-word segments, sentence ends
that got no cut, and the WER of the joined finals (a cut must not lose words).

    python bench/read_passages.py --out /tmp/passages
    python bench/segments.py /tmp/passages [--legacy] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from oasr.decoding import EndpointConfig
from oasr.engine import EngineConfig, configure_process
from oasr.engine.offline import transcribe_files
from oasr.text.wer import ErrorCounts, normalize_transcript

TOLERANCE_S = 0.1


def classify(segments: list[dict[str, Any]], sentences: list[dict[str, Any]]) -> dict[str, Any]:
    """Cuts (the midpoint between one final's last token and the next one's first) that lie
    in a sentence pause or inside a sentence; one-word segments; sentence ends with no cut."""
    spoken = [s for s in segments if s["text"]]
    cuts = [(a["end"] + b["start"]) / 2 for a, b in zip(spoken, spoken[1:], strict=False)]
    pauses = [(a["end"] - TOLERANCE_S, b["start"] + TOLERANCE_S)
              for a, b in zip(sentences, sentences[1:], strict=False)]
    at_pause = [any(lo <= c <= hi for lo, hi in pauses) for c in cuts]
    missed = sum(not any(lo <= c <= hi for c in cuts) for lo, hi in pauses)
    return {"segments": len(spoken),
            "lengths": [round(s["end"] - s["start"], 2) for s in spoken],
            "mid_sentence_cuts": sum(not a for a in at_pause),
            "one_word_segments": sum(len(s["text"].split()) == 1 for s in spoken),
            "missed_sentence_ends": missed, "sentence_ends": len(pauses)}


def run(passages: Path, config: EngineConfig) -> dict[str, dict[str, Any]]:
    """Per set ("real", "tts"): the summed classification and WER of the joined finals."""
    wavs = sorted(passages.glob("*.wav"))
    results = transcribe_files(config, wavs, progress=False)
    sets: dict[str, dict[str, Any]] = {}
    for wav, result in zip(wavs, results, strict=True):
        meta = json.loads(wav.with_suffix(".json").read_text())
        got = classify(result.segments, meta["sentences"])
        ref = " ".join(s["text"] for s in meta["sentences"])
        agg = sets.setdefault(wav.name.split("_")[0], {"files": 0, "lengths": [],
                                                      "counts": ErrorCounts()})
        agg["files"] += 1
        agg["lengths"] += got.pop("lengths")
        for key, value in got.items():
            agg[key] = agg.get(key, 0) + value
        agg["counts"].add(normalize_transcript(ref), normalize_transcript(result.text))
        agg.setdefault("per_file", {})[wav.stem] = [s["text"] for s in result.segments]
        if result.finish_reason != "stop":
            raise RuntimeError(f"{wav.name} ended with {result.finish_reason}: {result.error}")
    for agg in sets.values():
        lengths, counts = agg.pop("lengths"), agg.pop("counts")
        agg["median_length_s"] = round(statistics.median(lengths), 2) if lengths else 0.0
        agg["max_length_s"] = max(lengths, default=0.0)
        agg["wer"] = round(counts.wer, 2)
    return sets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("passages", type=Path)
    p.add_argument("--legacy", action="store_true", help="WeNet's 1 s / 20 s rules (EndpointConfig.wenet)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--show", action="store_true", help="print every file's finals")
    args = p.parse_args(argv)
    endpoint = EndpointConfig.wenet() if args.legacy else EndpointConfig()
    # all audio is queued at once: no idle timeout while a busy CPU works through it
    config = replace(EngineConfig(second_pass="none", num_threads=args.threads,
                                  idle_timeout_s=math.inf), endpoint=endpoint)
    configure_process(config.num_threads)
    sets = run(args.passages, config)
    print("| set | files | segments | median s | max s | mid-sentence cuts | one-word "
          "| sentence ends missed | WER |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, agg in sets.items():
        print(f"| {name} | {agg['files']} | {agg['segments']} | {agg['median_length_s']} "
              f"| {agg['max_length_s']} | {agg['mid_sentence_cuts']} "
              f"| {agg['one_word_segments']} "
              f"| {agg['missed_sentence_ends']}/{agg['sentence_ends']} | {agg['wer']} |")
        if args.show:
            for stem, texts in agg["per_file"].items():
                print(stem, " | ".join(texts))
    if args.json is not None:
        args.json.write_text(json.dumps(sets, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
