"""Stage 2b: digit strings spoken one digit at a time (``train_digits`` split).

A phone number read digit by digit, or a string assembled from single-digit recordings, sounds
unlike a sentence: every digit carries an isolated word's full length and falling pitch, with a
pause and often a level change between digits, and the recording is frequently 8 kHz. The main
corpus speaks its digit strings as fluent sentences, and the model misheard the isolated style
badly. This stage makes that style from the same training voices:

1. a bank: each of ``num_voices`` training voices (``voices.sample_voice``) speaks the ten digit
   words as ten separate utterances; each clip is trimmed to its speech and resampled to 16 kHz;
2. strings: ``num_strings`` random strings of ``min_digits``-``max_digits`` digits, each from one
   voice's clips, joined with random pauses and per-digit gain changes, then augmented like the
   main corpus (``augment.draw_plan``), with an 8 kHz round trip more often.

Outputs ``<data>/wav/train_digits/*.wav`` and ``<data>/manifests/train_digits.tsv`` (the
columns of ``synth.py``). Deterministic from the seed; finished wavs are not redone. Strings
that equal a transcript of the test material are never drawn.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from recipes.augment import SAMPLE_RATE, apply_augment, draw_plan
from recipes.paths import DATA_ROOT
from recipes.synth import write_wav
from recipes.text import DIGIT_WORDS, TEST_AUDIO_ROOT, forbidden_sentences
from recipes.voices import SynthRequest, Voice, sample_voice, synthesize_batch

SPLIT = "train_digits"


@dataclass(frozen=True)
class DigitStringConfig:
    """How many voices and strings, and how the digits are joined."""

    num_voices: int = 300
    num_strings: int = 2400
    min_digits: int = 3
    max_digits: int = 9
    min_gap_s: float = 0.0  # pause between two digits' trimmed speech
    max_gap_s: float = 0.35
    max_digit_gain_db: float = 4.0  # each digit's level varies by up to +-this
    via_8k_probability: float = 0.5  # on top of the main corpus's augmentation plan
    num_workers: int = 2
    seed: int = 9091

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {self}")
        if self.num_voices < 1 or self.num_strings < 1 or self.num_workers < 1:
            raise ValueError(f"sizes must be >= 1, got {self}")
        if not 0.0 <= self.min_gap_s <= self.max_gap_s:
            raise ValueError(f"need 0 <= min_gap_s <= max_gap_s, got {self}")


def trim_silence(samples: np.ndarray, sample_rate: int, threshold_db: float = -35.0,
                 margin_s: float = 0.03, frame_s: float = 0.01) -> np.ndarray:
    """The span of ``samples`` whose 10 ms frames reach ``threshold_db`` below the loudest
    frame, widened by ``margin_s`` each side; all-silent input comes back unchanged."""
    frame = max(1, int(frame_s * sample_rate))
    num_frames = len(samples) // frame
    if num_frames == 0:
        return samples
    frames = samples[: num_frames * frame].reshape(num_frames, frame).astype(np.float64)
    energy = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-20)
    loud = np.flatnonzero(energy >= energy.max() + threshold_db)
    if energy.max() <= -190 or len(loud) == 0:
        return samples
    margin = int(margin_s * sample_rate)
    start = max(0, int(loud[0]) * frame - margin)
    end = min(len(samples), (int(loud[-1]) + 1) * frame + margin)
    return samples[start:end]


def join_digits(clips: list[np.ndarray], gaps_s: list[float], gains_db: list[float],
                sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Clips scaled by their gains with ``gaps_s[i]`` of silence between clip i and i + 1."""
    if len(gaps_s) != len(clips) - 1 or len(gains_db) != len(clips):
        raise ValueError(f"{len(clips)} clips need {len(clips) - 1} gaps and {len(clips)} gains, "
                         f"got {len(gaps_s)} and {len(gains_db)}")
    parts: list[np.ndarray] = []
    for i, (clip, gain) in enumerate(zip(clips, gains_db, strict=True)):
        parts.append((clip * 10 ** (gain / 20)).astype(np.float32))
        if i < len(gaps_s):
            parts.append(np.zeros(int(round(gaps_s[i] * sample_rate)), np.float32))
    return np.concatenate(parts)


def bank_voices(cfg: DigitStringConfig) -> list[Voice]:
    """The training voices that speak the digit bank (never a held-out voice)."""
    rng = random.Random(cfg.seed)
    return [sample_voice(rng, heldout=False) for _ in range(cfg.num_voices)]


def speak_digits(voice: Voice, seed: int, tmp: Path) -> list[np.ndarray]:
    """The ten digit words spoken separately by ``voice``: trimmed 16 kHz float32 clips."""
    requests = [SynthRequest(voice, word, seed + d) for d, word in enumerate(DIGIT_WORDS)]
    clips = []
    for audio in synthesize_batch(requests, tmp):
        samples = audio.samples
        if audio.sample_rate != SAMPLE_RATE:
            samples = soxr.resample(samples, audio.sample_rate, SAMPLE_RATE).astype(np.float32)
        clips.append(trim_silence(samples, SAMPLE_RATE))
    return clips


@dataclass(frozen=True)
class DigitString:
    """One planned utterance: which voice's clips, in which order, joined how."""

    id: str
    voice_index: int
    digits: tuple[int, ...]
    gaps_s: tuple[float, ...]
    gains_db: tuple[float, ...]
    seed: int

    @property
    def text(self) -> str:
        return " ".join(DIGIT_WORDS[d] for d in self.digits)


def plan_strings(cfg: DigitStringConfig, forbidden: set[str]) -> list[DigitString]:
    """``num_strings`` strings; a string equal to a ``forbidden`` transcript is redrawn."""
    rng = random.Random(cfg.seed + 1)
    out: list[DigitString] = []
    while len(out) < cfg.num_strings:
        n = rng.randint(cfg.min_digits, cfg.max_digits)
        digits = tuple(rng.randrange(10) for _ in range(n))
        if " ".join(DIGIT_WORDS[d] for d in digits) in forbidden:
            continue
        out.append(DigitString(
            f"{SPLIT}-{len(out):05d}", rng.randrange(cfg.num_voices), digits,
            tuple(round(rng.uniform(cfg.min_gap_s, cfg.max_gap_s), 3) for _ in range(n - 1)),
            tuple(round(rng.uniform(-1, 1) * cfg.max_digit_gain_db, 2) for _ in range(n)),
            rng.randrange(2**31)))
    return out


def wav_path(data: Path, item: DigitString) -> Path:
    return data / "wav" / SPLIT / f"{item.id}.wav"


def run_voice(args: tuple[Path, DigitStringConfig, int, Voice, list[DigitString]]
              ) -> tuple[int, float]:
    """Speak one voice's bank and write its missing strings; (files written, audio seconds)."""
    data, cfg, index, voice, items = args
    todo = [it for it in items if not wav_path(data, it).exists()]
    if not todo:
        return 0, 0.0
    seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="oasr-digits-") as tmp_name:
        tmp = Path(tmp_name)
        clips = speak_digits(voice, cfg.seed * 1000 + index, tmp)
        for item in todo:
            rng = random.Random(item.seed)
            plan = draw_plan(rng, True)
            if rng.random() < cfg.via_8k_probability:
                plan = dataclasses.replace(plan, via_8k=True)
            joined = join_digits([clips[d] for d in item.digits], list(item.gaps_s),
                                 list(item.gains_db))
            seconds += write_wav(wav_path(data, item),
                                 apply_augment(joined, SAMPLE_RATE, plan, item.seed, tmp))
    return len(todo), seconds


def make_digit_strings(data: Path, cfg: DigitStringConfig, audio_root: Path) -> tuple[int, float]:
    """Write the missing wavs and ``manifests/train_digits.tsv``; returns (files, hours)."""
    voices = bank_voices(cfg)
    items = plan_strings(cfg, forbidden_sentences(audio_root))
    by_voice: dict[int, list[DigitString]] = {}
    for item in items:
        by_voice.setdefault(item.voice_index, []).append(item)
    tasks = [(data, cfg, i, voices[i], group) for i, group in sorted(by_voice.items())]
    start, done, secs = time.time(), 0, 0.0
    with mp.get_context("spawn").Pool(cfg.num_workers) as pool:
        for k, (n, s) in enumerate(pool.imap_unordered(run_voice, tasks)):
            done, secs = done + n, secs + s
            if k % 25 == 0 or k == len(tasks) - 1:
                rate = secs / max(time.time() - start, 1e-6)
                print(f"voice {k + 1}/{len(tasks)}: {done} new files, {secs / 3600:.2f} h "
                      f"({rate:.1f} audio-s/s)", flush=True)
    rows, hours = [], 0.0
    for item in items:
        path = wav_path(data, item)
        if path.exists():
            secs = sf.info(str(path)).duration
            hours += secs / 3600
            rows.append(f"{item.id}\t{path}\t{secs:.3f}\t{voices[item.voice_index].name}\t"
                        f"{item.text}")
    (data / "manifests").mkdir(parents=True, exist_ok=True)
    (data / "manifests" / f"{SPLIT}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return len(rows), hours


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--audio-root", type=Path, default=TEST_AUDIO_ROOT)
    parser.add_argument("--num-voices", type=int, default=DigitStringConfig.num_voices)
    parser.add_argument("--num-strings", type=int, default=DigitStringConfig.num_strings)
    parser.add_argument("--workers", type=int, default=DigitStringConfig.num_workers)
    args = parser.parse_args(argv)
    cfg = DigitStringConfig(num_voices=args.num_voices, num_strings=args.num_strings,
                            num_workers=args.workers)
    n, hours = make_digit_strings(args.data, cfg, args.audio_root)
    print(f"{SPLIT}: {n} files, {hours:.2f} h")


if __name__ == "__main__":
    main()
