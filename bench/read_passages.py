"""Long read passages with known sentence boundaries, for tuning and checking endpointing.

Two kinds, both written as 16 kHz mono WAVs with a JSON of where every sentence's speech
starts and ends:

- ``real_*``: the devset's read recordings (LibriVox Sense and Sensibility, JFK), trimmed to
  their speech and joined in a seeded order: clips that continue one sentence are joined by a
  breath (0.2-0.4 s), sentences by a sentence pause (0.6-1.2 s). The pauses hold room tone of
  the recording's own level and colour, as a microphone left open between sentences records them
  (``--silent-gaps``: digital silence instead, as a noise gate sends; the recording's room
  tone after its last word then ends in a step to silence).
- ``tts_*``: public-domain paragraphs (Dickens, Austen, Melville) read by voices the model
  never trained on (flite awb, espeak-ng en-gb-x-rp + m3) or trained on (flite slt, espeak-ng
  en-us): every clause is synthesised alone and trimmed, clauses joined by a breath and
  sentences by a sentence pause (same ranges as the real passages).

A stress variant of the same passages (``--pacing tight``: breaths of 0.3-0.5 s against
sentence pauses of 0.5-0.8 s, the two closer together than a careful reader's; ``--level-db``
and ``--snr-db``: the speech re-levelled and mixed with pink noise) checks that a rule tuned on
the first set holds where pauses and levels are not what it was tuned on. ``--applause``
puts a burst of applause (synthesised claps, 1-2 s, 10-20 dB below the speech) into every
sentence pause but the last, 0.1-0.3 s after the sentence: sound that is not speech, which the
streaming CTC pass may write letters for, between a sentence and the next.

    python bench/read_passages.py --out /tmp/passages
    python bench/read_passages.py --out /tmp/passages_tight --pacing tight --level-db -18 --snr-db 20
    python bench/read_passages.py --out /tmp/passages_applause --applause
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.benchmarks.workload import (
    DEVSET_DIR,
    ROOM_ABOVE_FLOOR_DB,
    pink_noise,
    room_of,
    room_tone,
    speech_bounds,
)

BREATH_S = (0.2, 0.4)
SENTENCE_PAUSE_S = (0.6, 1.2)
# (breath, sentence pause) ranges in seconds, by pacing
PACINGS = {"read": (BREATH_S, SENTENCE_PAUSE_S), "tight": ((0.3, 0.5), (0.5, 0.8))}
# --applause: (silence before the burst, its length, its level below the sentence's) ranges
APPLAUSE_GAP_S, APPLAUSE_S, APPLAUSE_BELOW_DB = (0.1, 0.3), (1.0, 2.0), (10.0, 20.0)
ROOM_SEED = 1000  # the room tone's own generator (`join`)
SS = "real_sense_and_sensibility_01_austen_64kb-0{}.wav"
# each real sentence: the clips that read it, in order (0880+0890 and 0920+0930 are one
# sentence each in the book)
REAL_SENTENCES = [[SS.format(870)], [SS.format(880), SS.format(890)],
                  [SS.format(920), SS.format(930)], ["real_jfk.wav"]]
TEXTS = {
    "dickens": [
        "It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
        "incredulity.",
        "There were a king with a large jaw and a queen with a plain face, on the throne of "
        "England.",
        "In short, the period was so far like the present period, that some of its noisiest "
        "authorities insisted on its being received, for good or for evil, in the superlative "
        "degree of comparison only.",
        "It was the year of Our Lord one thousand seven hundred and seventy five.",
    ],
    "austen": [
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "However little known the feelings or views of such a man may be on his first entering "
        "a neighbourhood, this truth is so well fixed in the minds of the surrounding families, "
        "that he is considered the rightful property of some one or other of their daughters.",
        "My dear Mister Bennet, said his lady to him one day, have you heard that Netherfield "
        "Park is let at last?",
        "Mister Bennet replied that he had not.",
    ],
    "melville": [
        "Call me Ishmael.",
        "Some years ago, never mind how long precisely, having little or no money in my purse, "
        "and nothing particular to interest me on shore, I thought I would sail about a little "
        "and see the watery part of the world.",
        "It is a way I have of driving off the spleen and regulating the circulation.",
        "Whenever I find myself growing grim about the mouth, I account it high time to get "
        "to sea as soon as I can.",
    ],
}
VOICES = {"awb": ["flite", "-voice", "awb"], "slt": ["flite", "-voice", "slt"],
          "rp": ["espeak-ng", "-v", "en-gb-x-rp+m3", "-s", "155"],
          "us": ["espeak-ng", "-v", "en-us", "-s", "165"]}


def _trimmed(audio: np.ndarray, threshold_db: float = -40.0,
             margin_s: float = 0.03) -> tuple[int, int]:
    """The samples `trim` keeps: its `speech_bounds` widened by ``margin_s`` each side."""
    lo, hi = speech_bounds(audio, threshold_db)
    margin = int(margin_s * MODEL_SAMPLE_RATE)
    return max(0, lo - margin), min(len(audio), hi + margin)


def trim(audio: np.ndarray, threshold_db: float = -40.0, margin_s: float = 0.03) -> np.ndarray:
    """The span from the first to the last 10 ms frame within ``threshold_db`` of the peak."""
    lo, hi = _trimmed(audio, threshold_db, margin_s)
    return audio[lo:hi]


def room_tail(audio: np.ndarray) -> float:
    """Seconds of a recording that `trim` keeps after its last word: its room tone (the -40
    dB bound against the one 12 dB above its floor, `speech_bounds`: 0.2-0.45 s for the
    LibriVox clips) and the trim's 30 ms margin."""
    spoken = speech_bounds(audio, above_floor_db=ROOM_ABOVE_FLOOR_DB)[1]
    return max(0, _trimmed(audio)[1] - spoken) / MODEL_SAMPLE_RATE


def synthesise(voice: str, text: str) -> np.ndarray:
    """One clause in ``voice``, 16 kHz float32."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "out.wav"
        cmd = VOICES[voice]
        args = [*cmd, "-t", text, "-o", str(wav)] if cmd[0] == "flite" else [*cmd, "-w", str(wav), text]
        subprocess.run(args, check=True, capture_output=True)
        return read_audio(wav)


def clauses(sentence: str) -> list[str]:
    """A sentence split at its commas (each clause is read alone, then joined by a breath)."""
    return [c.strip() for c in sentence.split(",") if c.strip()]


def applause(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """``seconds`` of applause at unit RMS: claps at random (20-40 a second), each a burst of
    high-passed noise that dies away in a few milliseconds, at random strengths, faded in and
    out over 0.2 s."""
    n = int(seconds * MODEL_SAMPLE_RATE)
    out = np.zeros(n + MODEL_SAMPLE_RATE // 20)
    t = np.arange(MODEL_SAMPLE_RATE // 20) / MODEL_SAMPLE_RATE
    for at in np.sort(rng.uniform(0, seconds, int(seconds * rng.uniform(20, 40)))):
        clap = np.diff(rng.standard_normal(t.size + 1)) * np.exp(-t / rng.uniform(0.002, 0.008))
        i = int(at * MODEL_SAMPLE_RATE)
        out[i:i + t.size] += clap * rng.uniform(0.3, 1.0)
    out = out[:n]
    ramp = min(n // 2, MODEL_SAMPLE_RATE // 5)
    out[:ramp] *= np.linspace(0, 1, ramp)
    out[n - ramp:] *= np.linspace(1, 0, ramp)
    return (out / np.sqrt(np.mean(np.square(out)))).astype(np.float32)


def _rms(clips: list[np.ndarray]) -> float:
    """The RMS of the loud part (above 1 % of the peak) of a sentence's clips."""
    audio = np.concatenate(clips).astype(np.float64)
    loud = audio[np.abs(audio) > 0.01 * np.abs(audio).max()]
    return float(np.sqrt(np.mean(np.square(loud))))


def join(sentences: list[list[np.ndarray]], rng: np.random.Generator, lead_s: float = 0.5,
         pacing: str = "read", with_applause: bool = False, tails: list[float] | None = None,
         rooms: list[np.ndarray | None] | None = None
         ) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Clips joined: breaths inside a sentence, sentence pauses between (their ranges from
    ``PACINGS[pacing]``), with ``with_applause`` a burst of applause before every sentence
    pause but the last (`applause`); each sentence's (start, end) in seconds, its end
    ``tails[i]`` seconds before its last clip's (the room tone a recording keeps after its
    last word, `room_tail`). The lead, breaths and pauses after sentence ``i``'s clips hold
    room tone like ``rooms[i]`` (`room_tone` of a recording's `room_of`; None or no
    ``rooms``: digital silence), drawn from a generator of its own, so the pauses' lengths do
    not depend on it."""
    breath_s, pause_s = PACINGS[pacing]
    tails = tails or [0.0] * len(sentences)
    rooms = rooms or [None] * len(sentences)
    noise = np.random.default_rng(ROOM_SEED)

    def gap(i: int, num_samples: int) -> np.ndarray:
        return room_tone(noise, num_samples, rooms[i])

    pieces = [gap(0, int(lead_s * MODEL_SAMPLE_RATE))]
    spans, t = [], lead_s
    for i, clips in enumerate(sentences):
        start = t
        for j, clip in enumerate(clips):
            pieces.append(clip.astype(np.float32))
            t += len(clip) / MODEL_SAMPLE_RATE
            if j < len(clips) - 1:
                pieces.append(gap(i, int(rng.uniform(*breath_s) * MODEL_SAMPLE_RATE)))
                t += len(pieces[-1]) / MODEL_SAMPLE_RATE
        spans.append((round(start, 3), round(t - tails[i], 3)))
        if with_applause and i < len(sentences) - 1:
            before = int(rng.uniform(*APPLAUSE_GAP_S) * MODEL_SAMPLE_RATE)
            burst = applause(rng, rng.uniform(*APPLAUSE_S))
            burst *= _rms(clips) * 10 ** (-rng.uniform(*APPLAUSE_BELOW_DB) / 20)
            pieces += [gap(i, before), burst + gap(i, len(burst))]
            t += (before + len(burst)) / MODEL_SAMPLE_RATE
        pause = rng.uniform(*pause_s) if i < len(sentences) - 1 else 1.0
        pieces.append(gap(i, int(pause * MODEL_SAMPLE_RATE)))
        t += len(pieces[-1]) / MODEL_SAMPLE_RATE
    audio = np.concatenate(pieces)
    return audio, spans


def degrade(audio: np.ndarray, rng: np.random.Generator, level_db: float = 0.0,
            snr_db: float | None = None) -> np.ndarray:
    """``audio`` scaled by ``level_db`` and, with ``snr_db``, mixed with pink noise that
    lies ``snr_db`` below the speech's power (the pauses hold the noise too)."""
    out = audio.astype(np.float64) * 10 ** (level_db / 20)
    if snr_db is not None:
        noise = pink_noise(rng, len(out))
        loud = np.abs(out) > 0.01 * np.abs(out).max()
        speech = float(np.mean(np.square(out[loud])))
        out += noise * np.sqrt(speech / 10 ** (snr_db / 10))
    return np.clip(out, -1, 1).astype(np.float32)


def build(out: Path, devset: Path = DEVSET_DIR, seeds: int = 3, pacing: str = "read",
          level_db: float = 0.0, snr_db: float | None = None,
          with_applause: bool = False, silent_gaps: bool = False) -> list[Path]:
    """Write every passage (WAV + JSON of sentence spans and texts) under ``out``, paced by
    ``pacing``, with applause after sentences when ``with_applause`` (`join`), and degraded
    by ``level_db`` / ``snr_db`` (`degrade`). A real recording's pauses hold room tone like
    its own (`room_of`) unless ``silent_gaps`` (digital silence, as a noise gate sends); a
    TTS voice's are digital silence, as the voice writes them."""
    import soundfile as sf

    out.mkdir(parents=True, exist_ok=True)
    manifest = dict(line.rstrip("\n").split("\t", 1) for line in
                    (devset / "manifest.tsv").read_text().splitlines() if "\t" in line)
    written = []
    recorded = {name: read_audio(devset / name) for s in REAL_SENTENCES for name in s}
    real = {name: trim(audio) for name, audio in recorded.items()}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(REAL_SENTENCES))
        sents = [REAL_SENTENCES[i] for i in order]
        audio, spans = join([[real[n] for n in s] for s in sents], rng, pacing=pacing,
                            with_applause=with_applause,
                            tails=[room_tail(recorded[s[-1]]) for s in sents],
                            rooms=None if silent_gaps else
                            [room_of(recorded[s[-1]]) for s in sents])
        audio = degrade(audio, rng, level_db, snr_db)
        texts = [" ".join(manifest[n] for n in s) for s in sents]
        written.append(_write(out / f"real_{seed}", audio, spans, texts, sf))
    for seed, (voice, (name, sentences)) in enumerate(
            (v, t) for v in VOICES for t in TEXTS.items()):
        rng = np.random.default_rng(100 + seed)
        clips = [[trim(synthesise(voice, c)) for c in clauses(s)] for s in sentences]
        audio, spans = join(clips, rng, pacing=pacing, with_applause=with_applause)
        audio = degrade(audio, rng, level_db, snr_db)
        written.append(_write(out / f"tts_{voice}_{name}", audio, spans, sentences, sf))
    return written


def _write(stem: Path, audio: np.ndarray, spans: list[tuple[float, float]],
           texts: list[str], sf: object) -> Path:
    wav = stem.with_suffix(".wav")
    sf.write(wav, audio, MODEL_SAMPLE_RATE, subtype="PCM_16")  # type: ignore[attr-defined]
    stem.with_suffix(".json").write_text(json.dumps(
        {"sentences": [{"start": s, "end": e, "text": t} for (s, e), t in zip(spans, texts, strict=True)],
         "duration": round(len(audio) / MODEL_SAMPLE_RATE, 3)}, indent=1))
    return wav


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/passages"))
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--pacing", choices=sorted(PACINGS), default="read",
                   help="breath and sentence-pause ranges: read (0.2-0.4 / 0.6-1.2 s) or "
                   "tight (0.3-0.5 / 0.5-0.8 s)")
    p.add_argument("--level-db", type=float, default=0.0, help="scale the passages by this gain")
    p.add_argument("--snr-db", type=float, default=None,
                   help="mix in pink noise this far below the speech's power")
    p.add_argument("--applause", action="store_true",
                   help="a burst of applause after every sentence but the last")
    p.add_argument("--silent-gaps", action="store_true",
                   help="digital silence between the real recordings (a noise-gated source) "
                   "instead of their room tone")
    args = p.parse_args(argv)
    for wav in build(args.out, args.devset, pacing=args.pacing, level_db=args.level_db,
                     snr_db=args.snr_db, with_applause=args.applause,
                     silent_gaps=args.silent_gaps):
        print(wav)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
