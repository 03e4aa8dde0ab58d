"""Live text as a reader sees it: real read speech streamed at real-time pace through /ws/asr.

For each load (1, 4, 16, 64 concurrent clients by default) one ``oasr-server`` with the
Whisper second pass (refined partials on) serves clients that each stream a read passage at
real-time pace in 100 ms frames, and the script reports:

- ``last_partial_wer``: WER of the last partial shown before each final (the text a reader
  had in front of them when the segment ended), all segments of a passage joined;
- ``final_wer``: WER of the finals;
- ``final_lag_p50/p95``: a final's arrival minus the moment the audio at its ``end`` (the
  last word) was sent: the endpointer's trailing silence plus the second pass;
- ``after_speech_p50/p95``: for each final that ends a sentence (its ``end`` within 0.6 s of
  the sentence's), its arrival minus the moment the sentence's last word's sound ended
  (`speech_bounds`: its last 10 ms frame 12 dB above the recording's room tone) was sent: the
  wait after the reader stopped speaking, measured on the audio rather than on the CTC pass's
  last token (which comes 0.1-0.3 s before a word's sound ends, or after it);
- ``after_decision_p50/p95``: a final's arrival minus the moment the audio at its
  ``decided_at`` (what the server had received when it ended the segment) was sent: the
  second pass's time once the segment ended, the endpoint's wait left out;
- ``after_end_p50/p95``: each session's ``done`` minus the moment its client sent ``end``
  (after the passage's last pause: 0.9 s of room tone in the dev set's passages, about 1 s in
  `bench/read_passages.py`'s): the wait after the client's end for its last final, which that
  ``end`` decides unless the endpoint did first;
- ``settled_p50/p95``: when the page's text of a segment last became what its final says (the
  partial that first showed the final's words, every later partial of the segment the same;
  the final itself when none did), minus the same moment: how long after the last word a
  reader has the text they keep, while the final only confirms it;
- ``partial_p50/p95``: a partial's arrival minus the moment the audio at its ``end`` (what
  the engine had decoded) was sent, for each partial that advanced ``end``;
- ``changed_committed``: stable (committed) words that a later partial or the final of the
  same segment did not repeat (must be 0); punctuation a later text puts after a committed
  word ("you" -> "you.") is not a change of the word;
- ``stable_words``: the words a segment's last partial showed as stable, over every segment
  with a Whisper final (each is forced into its final), and ``stable_not_in_reference``:
  those whose word (case and punctuation aside) is nowhere in the passage's reference, a
  lower bound on the stable words that are wrong;
- ``refined_share``: clients that were shown refined (stable or tentative) words;
- ``num_finals`` (with text) and ``endpoints_between_chunks`` (of the server's endpoints, those
  decided on the quiet audio after a chunk);
- ``cpu``: where the box's CPU went during the level, in shares of one core: ``server`` (its
  process: the engine and the websockets), ``second_pass`` (each decoding process),
  ``load_generator`` (this script), and the engine's busy ``engine_steps_per_s`` with the
  ``audio_s_per_step`` each decoded (how well the streams' chunks shared steps);
- ``one_word_finals``: finals of one word (a sentence's last word cut off alone, or "yes.");
- ``mid_sentence_cuts``: finals that end more than 0.3 s inside a sentence's speech, i.e.
  segments that cut a sentence (at a breath, at a reader's pause, or mid-word; JFK's
  recording is one sentence with three long pauses);
- ``final_errors``: per passage, its sessions and their final word errors and words;
- with ``--alone FILE`` (the output of a one-client run over every passage, ``--levels 1
  --passes N``), ``final_wer_alone``: the WER the same sessions' passages had at one client.
  Clients read different passages at different loads, and the passages differ far more in
  difficulty (a TTS voice the model never heard) than a load costs: ``final_wer`` minus
  ``final_wer_alone`` is what the load cost in words.

Passages: the devset's read recordings (LibriVox, JFK) joined with sentence pauses, and
sentences synthesised by TTS voices the streaming model never trained on (flite awb,
espeak-ng's held-out variants); or, with ``--passages``, `bench/read_passages.py`'s long
passages, whose sentences hold breaths of 0.2-0.4 s (the pauses an endpoint must not cut at)
between pauses of 0.6-1.2 s. WER after ``oasr.text.wer.normalize_transcript``.

    python bench/live_text.py --levels 1 4 16 64 --out bench/results_live_text.json
    python bench/live_text.py --levels 1 2 --passes 3   # every passage at a demo's load
    python bench/read_passages.py --out /tmp/passages
    python bench/live_text.py --levels 2 --passes 3 --passages /tmp/passages --match real_ tts_awb
    python bench/live_text.py --levels 32 --passes 2 --passages /tmp/passages --stagger 30
    python bench/live_text.py --levels 1 --passes 15 --passages /tmp/passages --out /tmp/alone.json
    python bench/live_text.py --levels 32 --passes 2 --passages /tmp/passages --alone /tmp/alone.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf
import soxr
import websockets

from oasr.benchmarks.cpu_share import cpu_shares, pid_with_args, tree_cpu_seconds
from oasr.benchmarks.server_load import server_process
from oasr.benchmarks.workload import (
    DEVSET_DIR,
    ROOM_ABOVE_FLOOR_DB,
    room_of,
    room_tone,
    speech_bounds,
)
from oasr.text.wer import ErrorCounts, normalize_transcript

SR = 16000
SS = "real_sense_and_sensibility_01_austen_64kb-0{}.wav"
# the devset's read sentences, each the clips that read it (0880+0890 and 0920+0930 are one
# sentence each in the book; JFK's recording is one, its pauses inside and its applause after)
READ = ((SS.format(870),), (SS.format(880), SS.format(890)),
        (SS.format(920), SS.format(930)), ("real_jfk.wav",))
SYNTH = (("flite", "awb", ("the children played outside until it was dark",
                           "our flight was delayed by almost an hour",
                           "she ordered two coffees and a glass of water")),
         ("espeak-ng", "en-gb-x-gbcwmd+m7", ("open the window before the room gets too warm",
                                             "turn left after the third house on the right",
                                             "we counted forty two boxes in the warehouse")))


@dataclass
class Passage:
    name: str
    audio: np.ndarray  # (N,) float32 16 kHz
    reference: str
    # (start, end) seconds of each sentence's speech, when known (bench/read_passages.py)
    sentences: list[tuple[float, float]] = field(default_factory=list)


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), dtype=np.float32)


def _load(path: Path) -> np.ndarray:
    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    return soxr.resample(audio.mean(axis=1), rate, SR).astype(np.float32)


class _Joined:
    """A passage as it is put together: clips with 0.9 s pauses after a 0.5 s lead, and
    the span of each sentence's speech (`speech_bounds` of its first and last clip, the
    recordings' room tone left out). A pause holds the room tone of the clip before it
    (`room_tone`: a real recording's goes on through it; a TTS voice's is digital silence)."""

    def __init__(self) -> None:
        self.pieces, self.spans = [_silence(0.5)], []
        self.num_samples = len(self.pieces[0])
        self._noise = np.random.default_rng(0)

    def sentence(self, clips: list[np.ndarray]) -> None:
        start = self.num_samples + speech_bounds(clips[0], above_floor_db=ROOM_ABOVE_FLOOR_DB)[0]
        if len(self.pieces) == 1:  # the lead: the first clip's room
            self.pieces[0] = room_tone(self._noise, len(self.pieces[0]), room_of(clips[0]))
        for clip in clips:
            last = self.num_samples  # where the sentence's last clip begins, in the end
            self.pieces += [clip, room_tone(self._noise, int(0.9 * SR), room_of(clip))]
            self.num_samples += len(clip) + len(self.pieces[-1])
        end = last + speech_bounds(clips[-1], above_floor_db=ROOM_ABOVE_FLOOR_DB)[1]
        self.spans.append((start / SR, end / SR))

    def passage(self, name: str, reference: str) -> Passage:
        return Passage(name, np.concatenate(self.pieces), reference, self.spans)


def passages(devset: Path) -> list[Passage]:
    """The devset's read recordings joined, and the TTS voices' sentences, each passage
    with its sentences' spans."""
    manifest = dict(line.split("\t") for line in (devset / "manifest.tsv").read_text().splitlines())
    joined = _Joined()
    for names in READ:
        joined.sentence([_load(devset / name) for name in names])
    out = [joined.passage("devset_read", " ".join(manifest[n] for names in READ for n in names))]
    for engine, voice, sentences in SYNTH:
        if shutil.which(engine) is None:
            continue
        joined = _Joined()
        for text in sentences:
            with tempfile.TemporaryDirectory() as tmp:
                wav = Path(tmp) / "s.wav"
                cmd = ([engine, "-voice", voice, "-t", text, "-o", str(wav)] if engine == "flite"
                       else [engine, "-v", voice, "-w", str(wav), text])
                subprocess.run(cmd, check=True, capture_output=True)
                joined.sentence([_load(wav)])
        out.append(joined.passage(f"synth_{voice}", " ".join(sentences)))
    return out


def read_passages(directory: Path, prefixes: list[str]) -> list[Passage]:
    """The passages `bench/read_passages.py` wrote (those whose names start with one of
    ``prefixes``; all when none), with their sentences' spans."""
    out = []
    for meta in sorted(directory.glob("*.json")):
        if prefixes and not meta.stem.startswith(tuple(prefixes)):
            continue
        sentences = json.loads(meta.read_text())["sentences"]
        out.append(Passage(meta.stem, _load(meta.with_suffix(".wav")),
                           " ".join(x["text"] for x in sentences),
                           [(x["start"], x["end"]) for x in sentences]))
    return out


# a final that ends this far inside a sentence's speech (from its start and its end) cut
# the sentence
MID_SENTENCE_MARGIN_S = 0.3


def _inside_sentence(end: float, sentences: list[tuple[float, float]]) -> bool:
    return any(a + MID_SENTENCE_MARGIN_S < end < b - MID_SENTENCE_MARGIN_S for a, b in sentences)


# a final whose end lies this close to a sentence's end closes that sentence
SENTENCE_END_MARGIN_S = 0.6


def _sentence_end(end: float, sentences: list[tuple[float, float]]) -> float | None:
    """The end of the sentence that a final ending at ``end`` closes (None: none)."""
    near = [b for _, b in sentences if abs(end - b) < SENTENCE_END_MARGIN_S]
    return min(near, key=lambda b: abs(end - b)) if near else None


@dataclass
class ClientLog:
    passage: str
    sent: list[tuple[float, int]] = field(default_factory=list)  # (time, samples sent so far)
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    ended_at: float | None = None  # when the client sent ``end``
    error: str | None = None

    def sent_at(self, seconds: float) -> float | None:
        """When the sample at ``seconds`` of the stream had been sent."""
        want = seconds * SR
        for when, count in self.sent:
            if count >= want:
                return when
        return None


async def run_client(url: str, passage: Passage, delay: float) -> ClientLog:
    log = ClientLog(passage.name)
    pcm = (np.clip(passage.audio, -1, 1) * 32767).astype("<i2")
    frame = SR // 10
    await asyncio.sleep(delay)
    try:
        async with websockets.connect(url, max_size=2**22) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SR, "format": "s16le"}))

            async def receive() -> None:
                async for raw in ws:
                    message = json.loads(raw)
                    log.messages.append((time.monotonic(), message))
                    if message.get("type") == "done":
                        return

            reader = asyncio.create_task(receive())
            start = time.monotonic()
            for i in range(0, len(pcm), frame):
                await asyncio.sleep(max(0.0, start + i / SR - time.monotonic()))
                await ws.send(pcm[i:i + frame].tobytes())
                log.sent.append((time.monotonic(), min(len(pcm), i + frame)))
            await ws.send(json.dumps({"type": "end"}))
            log.ended_at = time.monotonic()
            await asyncio.wait_for(reader, 120)
    except Exception as exc:  # a failed client is reported, not fatal to the run
        log.error = f"{type(exc).__name__}: {exc}"
    return log


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, 100 * q)) if values else float("nan")


def _changed(committed: list[str], later: list[str]) -> int:
    """Committed words ``later`` does not repeat (trailing punctuation aside), or drops."""
    def bare(word: str) -> str:
        return word.rstrip(".,?!;:")

    num = sum(bare(a) != bare(b) for a, b in zip(committed, later, strict=False))
    return num + max(0, len(committed) - len(later))


def _bare(text: str) -> list[str]:
    """A text's words as a reader compares them: case and punctuation aside."""
    return normalize_transcript(text).split()


def analyse(logs: list[ClientLog], material: list[Passage]) -> dict[str, Any]:
    references = {p.name: p.reference for p in material}
    sentences = {p.name: p.sentences for p in material}
    last_partial, finals = ErrorCounts(), ErrorCounts()
    by_passage: dict[str, ErrorCounts] = {}
    lags, after_decision, after_speech, settled, after_end = [], [], [], [], []
    partial_lat, changed, refined = [], 0, 0
    stable_words, stable_unknown = 0, 0
    one_word, mid_sentence = 0, 0
    examples: list[dict[str, Any]] = []  # the first few changes, to see what changed
    texts: list[dict[str, Any]] = []  # per client: its finals (text, last partial, source, lag), to read
    for log in logs:
        last: dict[int, str] = {}
        stable: dict[int, list[str]] = {}
        final_texts: list[str] = []
        read: list[dict[str, Any]] = []
        shown: list[str] = []  # per final, the last partial of its segment
        shown_refined, decoded_end = False, -1.0
        done_at: float | None = None  # when the server's done came
        vocabulary = set(_bare(references[log.passage]))
        since: dict[int, float] = {}  # segment -> when its partials last changed their words
        for when, m in log.messages:
            if m["type"] == "done":
                done_at = when
            elif m["type"] == "partial":
                if _bare(m["text"]) != _bare(last.get(m["segment"], "")):
                    since[m["segment"]] = when
                last[m["segment"]] = m["text"]
                words = m.get("stable", "").split()
                before = stable.get(m["segment"], [])
                num = _changed(before, words)
                if num and len(examples) < 5:
                    examples.append({"by": "partial", "committed": before, "then": words})
                changed += num
                stable[m["segment"]] = words
                shown_refined |= bool(m.get("stable") or m.get("tentative"))
                if m.get("end", 0.0) > decoded_end:
                    decoded_end = m["end"]
                    sent = log.sent_at(decoded_end)
                    if sent is not None:
                        partial_lat.append(when - sent)
            elif m["type"] == "final":
                final_texts.append(m["text"])
                one_word += len(_bare(m["text"])) == 1
                mid_sentence += _inside_sentence(m["end"], sentences[log.passage])
                committed = stable.get(m["segment"], [])
                if m.get("source") != "ctc":
                    words = m["text"].split()
                    num = _changed(committed, words)
                    if num and len(examples) < 5:
                        examples.append({"by": "final", "committed": committed, "then": words})
                    changed += num
                    stable_words += len(committed)
                    stable_unknown += sum(not set(_bare(w)) <= vocabulary for w in committed)
                partial = last.pop(m["segment"], "")
                shown.append(partial)
                sent = log.sent_at(m["end"])
                decided = log.sent_at(m["decided_at"]) if "decided_at" in m else None
                if sent is not None and m["text"]:
                    lags.append(when - sent)
                    same = _bare(partial) == _bare(m["text"])
                    settled.append((since[m["segment"]] if same else when) - sent)
                if decided is not None and m["text"]:
                    after_decision.append(when - decided)
                spoken = _sentence_end(m["end"], sentences[log.passage])
                spoken_sent = log.sent_at(spoken) if spoken is not None else None
                waited = None
                if spoken_sent is not None and m["text"]:
                    waited = when - spoken_sent
                    after_speech.append(waited)
                read.append({"text": m["text"], "last_partial": partial, "end": m["end"],
                             "decided_at": m.get("decided_at"),
                             "source": m.get("source"), "reason": m.get("reason"),
                             "lag": None if sent is None else round(when - sent, 2),
                             "after_speech": None if waited is None else round(waited, 2)})
        last_partial.add(references[log.passage], " ".join(shown))
        finals.add(references[log.passage], " ".join(final_texts))
        by_passage.setdefault(log.passage, ErrorCounts()).add(references[log.passage],
                                                              " ".join(final_texts))
        refined += shown_refined
        ended = None if done_at is None or log.ended_at is None else done_at - log.ended_at
        if ended is not None:
            after_end.append(ended)
        texts.append({"passage": log.passage, "finals": read,
                      "after_end": None if ended is None else round(ended, 2)})
    return {
        "clients": len(logs), "errors": [log.error for log in logs if log.error],
        "last_partial_wer": round(last_partial.wer, 1), "final_wer": round(finals.wer, 1),
        "num_finals": len(lags), "one_word_finals": one_word,
        "mid_sentence_cuts": mid_sentence if any(sentences.values()) else None,
        "final_lag_p50": round(percentile(lags, 0.5), 2),
        "final_lag_p95": round(percentile(lags, 0.95), 2),
        "after_speech_p50": round(percentile(after_speech, 0.5), 2) if after_speech else None,
        "after_speech_p95": round(percentile(after_speech, 0.95), 2) if after_speech else None,
        "after_decision_p50": round(percentile(after_decision, 0.5), 2),
        "after_decision_p95": round(percentile(after_decision, 0.95), 2),
        "after_end_p50": round(percentile(after_end, 0.5), 2),
        "after_end_p95": round(percentile(after_end, 0.95), 2),
        "settled_p50": round(percentile(settled, 0.5), 2),
        "settled_p95": round(percentile(settled, 0.95), 2),
        "partial_p50": round(percentile(partial_lat, 0.5), 3),
        "partial_p95": round(percentile(partial_lat, 0.95), 3),
        "changed_committed": changed, "changed_examples": examples,
        "stable_words": stable_words, "stable_not_in_reference": stable_unknown,
        "refined_share": round(refined / max(len(logs), 1), 2),
        "final_errors": {name: {"sessions": c.utterances, "word_errors": c.word_errors,
                                "words": c.words} for name, c in sorted(by_passage.items())},
        "finals": texts,
    }


def wer_alone(final_errors: dict[str, dict[str, int]], alone: dict[str, dict[str, int]]
              ) -> float | None:
    """The WER of the same sessions' passages as one client had them: each passage's word
    errors per session in ``alone`` (an earlier run's ``final_errors``), as many times as
    ``final_errors`` has sessions of it; None when ``alone`` lacks one of its passages."""
    errors = words = 0.0
    for name, row in final_errors.items():
        if name not in alone or not alone[name]["sessions"]:
            return None
        errors += row["sessions"] * alone[name]["word_errors"] / alone[name]["sessions"]
        words += row["words"]
    return round(100.0 * errors / max(words, 1.0), 1)


@contextlib.contextmanager
def server(clients: int, log_path: Path, extra: list[str]) -> Iterator[str]:
    """One ``oasr-server`` with the second pass for ``clients`` clients (plus ``extra`` flags)."""
    flags = ["--max-connections", str(clients + 8), "--max-batch-size", str(max(clients, 4)),
             "--second-pass", "whisper", *extra]
    with server_process(flags, log_path) as address:
        yield address


async def run_level(address: str, clients: int, material: list[Passage],
                    passes: int = 1, stagger: float = 0.64) -> list[ClientLog]:
    """``clients`` concurrent clients; each streams ``passes`` passages one after another (a
    new session each), client i starting at passage i, ``stagger * i / clients`` seconds
    after the first."""
    url = f"ws://{address}/ws/asr"

    async def client(i: int) -> list[ClientLog]:
        logs = []
        for j in range(passes):
            delay = stagger * i / max(clients, 1) if j == 0 else 0.0
            logs.append(await run_client(url, material[(i + j) % len(material)], delay))
        return logs

    per_client = await asyncio.gather(*(client(i) for i in range(clients)))
    return [log for logs in per_client for log in logs]


class CpuMeter:
    """Where the box's CPU went during a level, in shares of one core: the server's process
    (its engine and websockets), each second-pass process below it, and this load generator
    (`oasr.benchmarks.cpu_share`; the processes' figures on Linux only); and the engine's
    busy steps a second and the audio seconds each decoded on average (`/api/stats`)."""

    def __init__(self, address: str) -> None:
        self.pid = pid_with_args("--port", address.rsplit(":", 1)[1])
        self.started = time.monotonic()
        self.own = time.process_time()
        self.before = tree_cpu_seconds(self.pid) if self.pid is not None else {}
        stats = httpx.get(f"http://{address}/api/stats", timeout=5).json()
        self.steps, self.audio = stats["step"]["num_steps"], stats["total_audio_s"]

    def read(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The level's figures, given ``/api/stats`` at its end."""
        wall = time.monotonic() - self.started
        out: dict[str, Any] = {"load_generator": round((time.process_time() - self.own) / wall, 3)}
        if self.pid is not None:
            shares = cpu_shares(self.before, tree_cpu_seconds(self.pid), wall)
            out["server"] = shares.pop(self.pid, None)
            out["second_pass"] = sorted(shares.values(), reverse=True)
        steps = stats["step"]["num_steps"] - self.steps
        if steps > 0:
            out["engine_steps_per_s"] = round(steps / wall, 1)
            out["audio_s_per_step"] = round((stats["total_audio_s"] - self.audio) / steps, 2)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--passes", type=int, default=1,
                        help="passages each client streams in turn (1: client i streams "
                        "passage i; 3 at one client: every passage, more finals to measure)")
    parser.add_argument("--passages", type=Path, default=None,
                        help="stream bench/read_passages.py's passages instead (their sentence "
                        "spans give mid_sentence_cuts)")
    parser.add_argument("--match", nargs="*", default=[],
                        help="with --passages: only those whose names start so (real_ tts_awb)")
    parser.add_argument("--stagger", type=float, default=0.64,
                        help="seconds over which the clients' starts are spread (0.64: within "
                        "one chunk, so clients reading the same passage end its sentences "
                        "together; longer: independent speakers)")
    parser.add_argument("--alone", type=Path, default=None,
                        help="a one-client run's --out over the same passages: report "
                        "final_wer_alone, the WER those sessions' passages had alone")
    parser.add_argument("server_flags", nargs="*", help="more oasr-server flags, after --")
    args = parser.parse_args(argv)
    material = (read_passages(args.passages, args.match) if args.passages is not None
                else passages(args.devset))
    alone = None
    if args.alone is not None:
        alone = json.loads(args.alone.read_text())[0]["final_errors"]
    print("passages: " + ", ".join(f"{p.name} {len(p.audio) / SR:.1f} s" for p in material))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels:
            with server(level, Path(tmp) / f"server{level}.log", args.server_flags) as address:
                meter = CpuMeter(address)
                logs = asyncio.run(run_level(address, level, material, args.passes,
                                                 args.stagger))
                stats = httpx.get(f"http://{address}/api/stats", timeout=5).json()
                cpu = meter.read(stats)
            row = {"level": level, **analyse(logs, material), "cpu": cpu,
                   "endpoints": stats.get("endpoints"),
                   "endpoints_between_chunks": stats.get("endpoints_between_chunks"),
                   "second_pass": {k: v for k, v in stats.get("second_pass", {}).items()
                                   if isinstance(v, int | float | bool)}}
            if alone is not None:
                row["final_wer_alone"] = wer_alone(row["final_errors"], alone)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k not in ("finals", "final_errors")}), flush=True)
    keys = ["level", "last_partial_wer", "final_wer", "final_lag_p50", "final_lag_p95",
            "after_speech_p50", "after_speech_p95", "after_decision_p50", "after_decision_p95",
            "after_end_p50", "after_end_p95",
            "settled_p50", "settled_p95", "num_finals", "one_word_finals", "mid_sentence_cuts",
            "partial_p50", "partial_p95", "changed_committed", "stable_words",
            "stable_not_in_reference", "refined_share"]
    if alone is not None:
        keys.insert(3, "final_wer_alone")
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
