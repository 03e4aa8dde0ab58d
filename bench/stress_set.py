"""Build the second-pass stress set: speech the devset does not hold, made from what we may use.

Subsets (16 kHz mono wav, ``manifest.tsv`` = file, subset, transcript):

- ``digits_resplice``: the devset's free-spoken-digit-dataset strings cut back into their single
  digits (silence between them), then new strings of 3-8 digits of one speaker joined with
  0.05-1.0 s pauses, per-digit level changes of +-6 dB, 0.1-1.5 s of leading and trailing
  silence, an overall peak of -30..-3 dBFS.
- ``digits_degraded``: the same kind of strings, half through an 8 kHz round trip, all with
  white or pink noise at 10-25 dB SNR.
- ``read_variants``: the devset's read sentences (LibriVox, JFK) with long leading/trailing
  silence and a low level, through an 8 kHz round trip with noise, and two joined with a pause.
- ``synth_digits`` / ``synth_sentences``: digit strings (fluent, and one digit at a time with
  pauses) and sentences spoken by TTS voices the streaming model never trained on (flite awb,
  espeak-ng's held-out accent and variants).

Every choice comes from one seeded generator, so a rerun writes the same files. Needs
espeak-ng and flite on PATH for the synthetic subsets (skipped with a warning otherwise).

    python bench/stress_set.py --out /tmp/oasr-stress
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from oasr.benchmarks.workload import DEVSET_DIR

SR = 16000
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
HELDOUT_VOICES = (("flite", "awb"), ("espeak", "en-gb-x-gbcwmd+m7"), ("espeak", "en-us+f5"),
                  ("espeak", "en-gb-x-gbcwmd+grandpa"), ("espeak", "en-029+zac"))
SENTENCES = (
    "please call me back at nine one one four two",
    "the train leaves at seven fifteen from platform three",
    "my new phone number is five five five two six eight",
    "we counted forty two boxes in the second warehouse",
    "the meeting moved to the twenty first of march",
    "turn left after the third house on the right",
    "she ordered two coffees and a glass of water",
    "the package weighs about six pounds",
    "he was born in nineteen eighty four",
    "open the window before the room gets too warm",
    "the children played outside until it was dark",
    "our flight was delayed by almost an hour",
)


def load(path: Path) -> np.ndarray:
    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    return audio if rate == SR else soxr.resample(audio, rate, SR).astype(np.float32)


def split_digits(audio: np.ndarray, expected: int) -> list[np.ndarray] | None:
    """Cut a string of isolated digits at its silences; None unless ``expected`` pieces."""
    frame = SR // 100
    n = len(audio) // frame
    energy = 10 * np.log10(np.square(audio[: n * frame].reshape(n, frame)).mean(1) + 1e-12)
    active = np.flatnonzero(energy > energy.max() - 30)
    if active.size == 0:
        return None
    groups, start, prev = [], active[0], active[0]
    for i in active[1:]:
        if i - prev > 12:  # 120 ms of silence separates two digits
            groups.append((start, prev))
            start = i
        prev = i
    groups.append((start, prev))
    groups = [g for g in groups if g[1] - g[0] >= 6]  # drop clicks
    if len(groups) != expected:
        return None
    pad = 4  # 40 ms each side
    return [audio[max(0, (a - pad) * frame): (b + 1 + pad) * frame] for a, b in groups]


def digit_bank(devset: Path) -> dict[str, dict[str, list[np.ndarray]]]:
    """speaker -> digit word -> clips, from the devset's digit-string files."""
    bank: dict[str, dict[str, list[np.ndarray]]] = {}
    for line in (devset / "manifest.tsv").read_text().splitlines():
        name, text = line.split("\t")
        words = text.split()
        if not name.startswith("real_") or not all(w in DIGITS for w in words):
            continue
        speaker = name.split("_")[1]
        clips = split_digits(load(devset / name), len(words))
        if clips is None:
            print(f"  {name}: could not cut into {len(words)} digits, skipped", file=sys.stderr)
            continue
        for word, clip in zip(words, clips, strict=True):
            bank.setdefault(speaker, {}).setdefault(word, []).append(clip)
    return bank


def silence(rng: random.Random, low: float, high: float) -> np.ndarray:
    return np.zeros(int(rng.uniform(low, high) * SR), dtype=np.float32)


def gain_db(audio: np.ndarray, db: float) -> np.ndarray:
    return (audio * 10 ** (db / 20)).astype(np.float32)


def set_peak(audio: np.ndarray, dbfs: float) -> np.ndarray:
    peak = float(np.abs(audio).max()) or 1.0
    return (audio * (10 ** (dbfs / 20) / peak)).astype(np.float32)


def add_noise(audio: np.ndarray, rng: random.Random, snr_db: float, kind: str) -> np.ndarray:
    gen = np.random.default_rng(rng.randrange(2**32))
    noise = gen.standard_normal(len(audio)).astype(np.float32)
    if kind == "pink":  # 1/f spectrum
        spectrum = np.fft.rfft(noise)
        spectrum /= np.sqrt(np.maximum(np.arange(spectrum.size), 1))
        noise = np.fft.irfft(spectrum, n=len(audio)).astype(np.float32)
    speech = float(np.mean(np.square(audio[np.abs(audio) > 0.01 * np.abs(audio).max()])))
    noise *= np.sqrt(speech / 10 ** (snr_db / 10) / float(np.mean(np.square(noise))))
    return np.clip(audio + noise, -1, 1).astype(np.float32)


def round_trip_8k(audio: np.ndarray) -> np.ndarray:
    return soxr.resample(soxr.resample(audio, SR, 8000), 8000, SR).astype(np.float32)


def digit_string(rng: random.Random, clips: dict[str, list[np.ndarray]]) -> tuple[np.ndarray, str]:
    words = [rng.choice(list(clips)) for _ in range(rng.randint(3, 8))]
    parts = [silence(rng, 0.1, 1.5)]
    for i, word in enumerate(words):
        if i:
            parts.append(silence(rng, 0.05, 1.0))
        parts.append(gain_db(rng.choice(clips[word]), rng.uniform(-6, 6)))
    parts.append(silence(rng, 0.1, 1.5))
    return np.concatenate(parts), " ".join(words)


def synthesize(engine: str, voice: str, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tts.wav"
        if engine == "flite":
            cmd = ["flite", "-voice", voice, "-t", text, "-o", str(out)]
        else:
            cmd = ["espeak-ng", "-v", voice, "-w", str(out), text]
        subprocess.run(cmd, check=True, capture_output=True)
        return load(out)


def build(out: Path, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str]] = []

    def save(subset: str, index: int, audio: np.ndarray, text: str) -> None:
        name = f"{subset}_{index:02d}.wav"
        sf.write(out / name, np.clip(audio, -1, 1), SR, subtype="PCM_16")
        rows.append((name, subset, text))

    bank = digit_bank(DEVSET_DIR)
    speakers = sorted(bank)
    for i in range(24):
        audio, text = digit_string(rng, bank[speakers[i % len(speakers)]])
        save("digits_resplice", i, set_peak(audio, rng.uniform(-30, -3)), text)
    for i in range(24):
        audio, text = digit_string(rng, bank[speakers[i % len(speakers)]])
        if i % 2:
            audio = round_trip_8k(audio)
        audio = add_noise(set_peak(audio, rng.uniform(-20, -3)), rng, rng.uniform(10, 25),
                          rng.choice(("white", "pink")))
        save("digits_degraded", i, audio, text)

    read = [line.split("\t") for line in (DEVSET_DIR / "manifest.tsv").read_text().splitlines()
            if line.startswith("real_") and not all(w in DIGITS for w in line.split("\t")[1].split())]
    for i, (name, text) in enumerate(read):
        audio = load(DEVSET_DIR / name)
        quiet = np.concatenate([silence(rng, 1.0, 2.5), set_peak(audio, -30), silence(rng, 1.5, 3)])
        save("read_variants", 3 * i, quiet, text)
        noisy = add_noise(round_trip_8k(audio), rng, rng.uniform(12, 20), "pink")
        save("read_variants", 3 * i + 1, noisy, text)
        other_name, other_text = read[(i + 1) % len(read)]
        joined = np.concatenate([audio, silence(rng, 0.3, 0.6), load(DEVSET_DIR / other_name)])
        save("read_variants", 3 * i + 2, joined, f"{text} {other_text}")

    if not (shutil.which("flite") and shutil.which("espeak-ng")):
        print("flite or espeak-ng missing: synthetic subsets skipped", file=sys.stderr)
        return rows
    for i in range(16):
        engine, voice = HELDOUT_VOICES[i % len(HELDOUT_VOICES)]
        words = [rng.choice(DIGITS) for _ in range(rng.randint(4, 8))]
        if i % 2:  # one digit at a time, as a number read out digit by digit
            parts = [silence(rng, 0.2, 1.0)]
            for word in words:
                parts += [set_peak(synthesize(engine, voice, word), rng.uniform(-12, -3)),
                          silence(rng, 0.1, 0.8)]
            audio = np.concatenate(parts)
        else:
            audio = set_peak(synthesize(engine, voice, " ".join(words)), -3)
        save("synth_digits", i, audio, " ".join(words))
    for i, text in enumerate(SENTENCES):
        engine, voice = HELDOUT_VOICES[(i + 2) % len(HELDOUT_VOICES)]
        audio = set_peak(synthesize(engine, voice, text), rng.uniform(-20, -3))
        if i % 3 == 2:
            audio = add_noise(audio, rng, rng.uniform(12, 25), "white")
        save("synth_sentences", i, np.concatenate([silence(rng, 0.2, 1.0), audio]), text)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "oasr-stress")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args(argv)
    rows = build(args.out, args.seed)
    with open(args.out / "manifest.tsv", "w") as f:
        for row in rows:
            f.write("\t".join(row) + "\n")
    counts: dict[str, int] = {}
    for _, subset, _ in rows:
        counts[subset] = counts.get(subset, 0) + 1
    print(f"{len(rows)} files in {args.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
