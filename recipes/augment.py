"""Waveform augmentation of synthesised speech: sox effects + numpy noise, gain and padding.

``AugmentPlan`` is drawn once per utterance from a seed (so a rerun makes the same file);
``apply_augment`` turns engine audio at its native rate into 16 kHz mono float32.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class AugmentPlan:
    """What happens to one utterance. Neutral values mean "off"."""

    tempo: float = 1.0  # sox tempo (duration change, pitch kept)
    pitch_cents: int = 0  # sox pitch
    reverb: int = 0  # sox reverb reverberance 0-100 (0: off)
    telephone: bool = False  # 300-3400 Hz band-pass
    via_8k: bool = False  # resample to 8 kHz and back
    noise: str = "none"  # none | white | pink | brown | hum
    snr_db: float = 30.0
    rms_dbfs: float = -22.0  # loudness the speech is scaled to
    pad_start_s: float = 0.2
    pad_end_s: float = 0.3

    def to_dict(self) -> dict:
        return asdict(self)


def draw_plan(rng: random.Random, augment: bool) -> AugmentPlan:
    """A random plan; ``augment=False`` gives clean speech with a little padding (eval splits)."""
    if not augment:
        return AugmentPlan(pad_start_s=round(rng.uniform(0.15, 0.4), 3),
                           pad_end_s=round(rng.uniform(0.2, 0.5), 3))
    return AugmentPlan(
        tempo=round(rng.uniform(0.85, 1.15), 3) if rng.random() < 0.5 else 1.0,
        pitch_cents=rng.randint(-250, 250) if rng.random() < 0.3 else 0,
        reverb=rng.randint(15, 60) if rng.random() < 0.2 else 0,
        telephone=rng.random() < 0.08,
        via_8k=rng.random() < 0.12,
        noise=rng.choice(("white", "pink", "brown", "hum")) if rng.random() < 0.45 else "none",
        snr_db=round(rng.uniform(8.0, 30.0), 1),
        rms_dbfs=round(rng.uniform(-38.0, -14.0), 1),
        pad_start_s=round(rng.uniform(0.05, 0.8), 3),
        pad_end_s=round(rng.uniform(0.15, 0.9), 3),
    )


def _sox_effects(plan: AugmentPlan) -> list[str]:
    effects: list[str] = []
    if plan.tempo != 1.0:
        effects += ["tempo", "-s", f"{plan.tempo}"]
    if plan.pitch_cents:
        effects += ["pitch", str(plan.pitch_cents)]
    if plan.reverb:
        effects += ["reverb", str(plan.reverb), "50", "60"]
    if plan.telephone:
        effects += ["sinc", "300-3400"]
    if plan.via_8k:
        effects += ["rate", "8000"]
    return effects + ["rate", str(SAMPLE_RATE), "channels", "1"]


def _noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) float32 noise of unit RMS."""
    if kind == "hum":
        t = np.arange(n) / SAMPLE_RATE
        base = rng.choice([50.0, 60.0])
        x = sum(np.sin(2 * np.pi * base * k * t + rng.uniform(0, 6.28)) / k for k in range(1, 6))
        x = x + 0.1 * rng.standard_normal(n)
    else:
        white = rng.standard_normal(n)
        if kind == "white":
            x = white
        else:  # shape the spectrum: pink 1/f power, brown 1/f^2
            spec = np.fft.rfft(white)
            f = np.maximum(np.fft.rfftfreq(n, 1.0 / SAMPLE_RATE), 20.0)
            spec /= np.sqrt(f) if kind == "pink" else f
            x = np.fft.irfft(spec, n)
    x = np.asarray(x, dtype=np.float64)
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def apply_augment(samples: np.ndarray, sample_rate: int, plan: AugmentPlan, seed: int,
                  tmp: Path) -> np.ndarray:
    """Augment one utterance.

    Args:
        samples: (N,) float32 engine audio at ``sample_rate``.
        plan: the effects to apply.
        seed: noise seed.
        tmp: scratch folder for sox.
    Returns:
        (M,) float32 at 16 kHz, peak <= 1.
    """
    src, dst = tmp / "aug_in.wav", tmp / "aug_out.wav"
    sf.write(str(src), samples, sample_rate, subtype="FLOAT")
    cmd = ["sox", "-q", str(src), "-b", "32", "-e", "floating-point", str(dst), *_sox_effects(plan)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    speech, _ = sf.read(str(dst), dtype="float32")
    speech = speech - float(np.mean(speech))
    rms = float(np.sqrt(np.mean(speech**2))) + 1e-9
    speech = speech * (10 ** (plan.rms_dbfs / 20) / rms)
    pad0, pad1 = int(plan.pad_start_s * SAMPLE_RATE), int(plan.pad_end_s * SAMPLE_RATE)
    out = np.concatenate([np.zeros(pad0, np.float32), speech, np.zeros(pad1, np.float32)])
    rng = np.random.default_rng(seed)
    if plan.noise != "none":
        noise_rms = 10 ** ((plan.rms_dbfs - plan.snr_db) / 20)
        out = out + noise_rms * _noise(plan.noise, len(out), rng)
    else:  # a faint floor: digital silence never occurs at a microphone
        out = out + 10 ** ((plan.rms_dbfs - 60) / 20) * rng.standard_normal(len(out))
    peak = float(np.max(np.abs(out)))
    if peak > 0.99:
        out = out * (0.99 / peak)
    return out.astype(np.float32)
