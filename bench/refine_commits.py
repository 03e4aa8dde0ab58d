"""What committed words cost the finals: refined partials replayed offline, segment by segment.

While a segment is open the engine re-decodes its audio so far (greedy, the segment's own
window) about every second, commits the words consecutive refinements agree on
(`oasr.engine.live.refine.LocalAgreement`), and decodes the segment's final with those words forced
as the start of its transcript. A word committed wrongly is then in the final for good. This
replays that schedule without the clock, once per commit rule (``--agreement N:H:P``:
``RefineConfig.agreeing``, ``hold_words``, ``min_word_prob``; the engine's default is 2:1:0.8,
whisper_streaming's 2:0:0): for every segment, refinements of its first
``--min-audio`` s, then every ``--interval`` s more, each with the committed words forced (as
``Refiner`` submits them) and applied by the engine's own ``Refiner.apply``; then the final
(beam search, the engine's default decode) with the committed words forced, and the same
final decoded free, with nothing forced. Printed per subset: word errors of the forced and of
the free finals, committed words, segments whose forced final has more errors than its free one.

Segments: a passage of `bench/read_passages.py` is cut into groups of sentences at pauses of
at least ``--pause`` s (the endpoint's silence) and at most ``--longest`` s long; every other
file (the stress set's, the devset's read speech) is one segment.

    python bench/read_passages.py --out /tmp/passages
    python bench/stress_set.py --out /tmp/oasr-stress
    python bench/refine_commits.py --passages /tmp/passages --stress /tmp/oasr-stress \\
        --agreement 2:0 3:0:0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.workload import DEVSET_DIR
from oasr.decoding.words import word_probabilities
from oasr.engine import EngineConfig, configure_process
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.refine import RefineConfig, Refiner
from oasr.engine.second_pass.jobs import RefineDone
from oasr.models.whisper import load_whisper
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.text.wer import ErrorCounts, edit_distance, normalize_transcript

sys.path.insert(0, str(Path(__file__).resolve().parent))
from second_pass_parity import add_stress_argument  # noqa: E402
from second_pass_parity import load_items as load_stress_items  # noqa: E402

TIMING = FrameTiming(frame_shift_s=0.04, right_context_samples=0)  # the Conformer's frames


@dataclass
class Segment:
    name: str
    subset: str
    audio: np.ndarray
    reference: str
    refiner: Refiner | None = None  # the commit rule (one per compared rule)
    request: Any = None  # what Refiner.apply reads: its refine state and segment
    decode_free: bool = True  # decode the free final too (once per segment of all variants)
    refined_s: float = 0.0  # audio the newest refinement heard
    texts: dict[str, str] = field(default_factory=dict)  # "forced" / "free" -> final text
    # after each refinement: (audio seconds it heard, committed words, words shown)
    trace: list[tuple[float, int, int]] = field(default_factory=list)


def passage_segments(passages: Path, pause_s: float, longest_s: float) -> list[Segment]:
    """Each passage's sentences grouped at pauses of ``pause_s`` or more, groups of at most
    ``longest_s``; a segment's audio runs from its first sentence's start to its last one's end
    (a little of the pauses around them kept)."""
    segments = []
    for wav in sorted(passages.glob("*.wav")):
        sentences = json.loads(wav.with_suffix(".json").read_text())["sentences"]
        audio = read_audio(wav)
        subset = "passages_real" if wav.name.startswith("real_") else "passages_tts"
        groups: list[list[dict[str, Any]]] = []
        for sentence in sentences:
            last = groups[-1] if groups else None
            if (last is None or sentence["start"] - last[-1]["end"] >= pause_s
                    or sentence["end"] - last[0]["start"] > longest_s):
                groups.append([sentence])
            else:
                last.append(sentence)
        for i, group in enumerate(groups):
            start = max(0.0, group[0]["start"] - 0.2)
            end = group[-1]["end"] + 0.3
            piece = audio[round(start * MODEL_SAMPLE_RATE): round(end * MODEL_SAMPLE_RATE)]
            segments.append(Segment(f"{wav.stem}#{i}", subset, piece,
                                    " ".join(s["text"] for s in group)))
    return segments


def file_segments(stress: Sequence[Path], devset: Path | None, longest_s: float
                  ) -> list[Segment]:
    segments = []
    for item in load_stress_items(stress, devset):
        audio = read_audio(item.path)
        if len(audio) <= longest_s * MODEL_SAMPLE_RATE:
            segments.append(Segment(item.path.stem, item.subset, audio, item.reference))
    return segments


class Replay:
    """Runs every segment's refinements, then its two finals, through one decoder (the
    segments decode side by side, as the engine's streams do)."""

    def __init__(self, decoder: ContinuousWhisperDecoder, config: RefineConfig) -> None:
        self.decoder = decoder
        self.config = config  # the refinements' schedule
        self._ids = iter(range(1, 1 << 30))

    def run(self, segments: list[Segment]) -> None:
        jobs: dict[int, tuple[Segment, str, float]] = {}  # request id -> (segment, kind, seconds)
        for segment in segments:
            self._next(segment, jobs)
        while jobs:
            for result in self.decoder.step():
                segment, kind, seconds = jobs.pop(result.request_id)
                if kind == "refine":
                    self._apply(segment, result, seconds)
                    self._next(segment, jobs)
                else:
                    segment.texts[kind] = result.text.strip()

    def _next(self, segment: Segment, jobs: dict[int, tuple[Segment, str, float]]) -> None:
        """Submit the segment's next refinement, or its finals once it has heard it all."""
        duration = len(segment.audio) / MODEL_SAMPLE_RATE
        seconds = (self.config.min_audio_s if not segment.trace
                   else segment.refined_s + self.config.interval_s)
        state = segment.request.refine
        if seconds < duration:
            job_id = next(self._ids)
            state.in_flight = job_id
            jobs[job_id] = (segment, "refine", seconds)
            self.decoder.submit(job_id, segment.audio[: round(seconds * MODEL_SAMPLE_RATE)],
                                prefix=state.prefix_tokens, background=True)
            return
        kinds = [("forced", state.prefix_tokens)] + [("free", ())] * segment.decode_free
        for kind, prefix in kinds:
            job_id = next(self._ids)
            jobs[job_id] = (segment, kind, duration)
            self.decoder.submit(job_id, segment.audio, prefix=prefix)

    def _apply(self, segment: Segment, result: Any, seconds: float) -> None:
        tokens = tuple(result.tokens)
        state = segment.request.refine
        ends = tuple(self.decoder.word_ends(tokens)) if tokens else ()
        probs = word_probabilities(ends, len(state.prefix_tokens), result.token_log_probs)
        done = RefineDone(state.in_flight, 0, 0, result.text.strip(), tokens, ends,
                          bool(result.failed), round(seconds / TIMING.frame_shift_s), probs)
        assert segment.refiner is not None
        segment.refiner.apply(segment.request, done)
        agreement = state.agreement
        segment.trace.append((seconds, len(agreement.committed), len(agreement.latest)))
        segment.refined_s = seconds


def _errors(reference: str, text: str) -> int:
    return edit_distance(normalize_transcript(reference).split(), normalize_transcript(text).split())


def summarise(segments: list[Segment]) -> list[dict[str, Any]]:
    rows = []
    for subset in [*dict.fromkeys(s.subset for s in segments), "all"]:
        group = [s for s in segments if subset in ("all", s.subset)]
        forced, free = ErrorCounts(), ErrorCounts()
        worse = 0
        first_commits: list[float] = []  # audio seconds when a segment first had stable words
        shares: list[float] = []  # stable share of the words shown, after each refinement
        for s in group:
            forced.add(s.reference, s.texts["forced"])
            free.add(s.reference, s.texts["free"])
            worse += _errors(s.reference, s.texts["forced"]) > _errors(s.reference, s.texts["free"])
            first_commits += [seconds for seconds, committed, _ in s.trace if committed][:1]
            shares += [committed / shown for _, committed, shown in s.trace if shown]
        rows.append({
            "subset": subset, "segments": len(group), "words": forced.words,
            "forced_errors": forced.word_errors, "free_errors": free.word_errors,
            "committed": sum(len(s.request.refine.agreement.committed) for s in group),
            "refinements": sum(len(s.trace) for s in group),
            "forced_worse": worse,
            "with_commits": len(first_commits),
            "first_commit_s_p50": (round(float(np.median(first_commits)), 1)
                                   if first_commits else None),
            "stable_share": round(float(np.mean(shares)), 3) if shares else None,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=Path, help="bench/read_passages.py's output")
    add_stress_argument(parser)
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--pause", type=float, default=1.0,
                        help="a passage's segments end at sentence pauses this long (s)")
    parser.add_argument("--longest", type=float, default=20.0, help="longest segment (s)")
    parser.add_argument("--interval", type=float, default=RefineConfig.interval_s)
    parser.add_argument("--min-audio", type=float, default=RefineConfig.min_audio_s)
    parser.add_argument("--agreement", nargs="+", default=["2:0"], metavar="N:H[:P]",
                        help="commit rules to compare: N refinements in a row agree, the "
                             "oldest one's last H words held (LocalAgreement's agreeing, "
                             "hold_words), only words whose tokens were at least P likely")
    parser.add_argument("--subsets", nargs="+", help="only these subsets")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the rows and every segment's texts")
    args = parser.parse_args(argv)
    configure_process(args.threads)
    segments = (passage_segments(args.passages, args.pause, args.longest)
                if args.passages else [])
    segments += file_segments(args.stress, args.devset, args.longest)
    segments = [s for s in segments if args.subsets is None or s.subset in args.subsets]
    config = RefineConfig(interval_s=args.interval, min_audio_s=args.min_audio)
    rules = [rule if rule.count(":") == 2 else rule + ":0" for rule in args.agreement]
    runs = {}
    for i, rule in enumerate(rules):
        agreeing, hold, min_prob = rule.split(":")
        refiner = Refiner(replace(config, agreeing=int(agreeing), hold_words=int(hold),
                                  min_word_prob=float(min_prob)),
                          worker=None, timing=TIMING, tokenizer=None, next_job_id=lambda: 0)
        runs[rule] = [replace(s, refiner=refiner, texts={}, trace=[], decode_free=not i,
                              request=SimpleNamespace(refine=refiner.new_state(), segment=0))
                      for s in segments]
    decoder = ContinuousWhisperDecoder(load_whisper(), EngineConfig().second_pass_decode_config())
    start = time.perf_counter()
    Replay(decoder, config).run([s for run in runs.values() for s in run])
    first = runs[rules[0]]
    for run in runs.values():
        for segment, free in zip(run, first, strict=True):
            segment.texts["free"] = free.texts["free"]
    print(f"{len(segments)} segments, {len(rules)} rules in {time.perf_counter() - start:.0f} s")
    out: dict[str, Any] = {}
    for rule, run in runs.items():
        rows = summarise(run)
        print(f"\nagreeing:hold:min_prob {rule}")
        print("subset                segments  words  forced  free  committed  refinements  worse"
              "  with_commits  first_commit_s  stable_share")
        for r in rows:
            print(f"{r['subset']:20s} {r['segments']:9d} {r['words']:6d} {r['forced_errors']:7d} "
                  f"{r['free_errors']:5d} {r['committed']:10d} {r['refinements']:12d} "
                  f"{r['forced_worse']:6d} {r['with_commits']:13d} "
                  f"{r['first_commit_s_p50'] or '-':>15} {r['stable_share'] or 0:13.3f}")
        out[rule] = {"rows": rows, "segments": [
            {"name": s.name, "subset": s.subset, "reference": s.reference, **s.texts,
             "committed": " ".join(s.request.refine.agreement.committed)} for s in run]}
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
