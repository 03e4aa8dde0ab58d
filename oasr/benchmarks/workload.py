"""What every benchmark runs on: one model, real speech, and the engine configs built from them.

The model is the bundled default when it exists, else a seeded random model of the bundled
model's architecture (the config ``recipes/train.py`` trains): speed does not depend on trained
weights, and the report says which one ran. Input audio is real speech from the dev set, each
stream a different rotation of its files so no two streams carry identical samples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.models import AsrModel, ConformerConfig, load_model
from oasr.models.bundled import BUNDLED_UNITS, bundled_architecture
from oasr.models.checkpoint import DEFAULT_MODEL_DIR

AUDIO_DIR_ENV = "OASR_BENCH_AUDIO"
CHUNK_SECONDS_PER_FRAME = 0.04  # one encoder frame: 4x subsampling of 10 ms fbank frames
# The bundled model's units (recipes/train.py UNITS): blank, unk, apostrophe, a-z, word marker.
def tiny_architecture() -> ConformerConfig:
    """A 2-block, 32-wide model: for tests of the benchmark machinery, never for numbers."""
    return ConformerConfig(
        input_dim=80, vocab_size=len(BUNDLED_UNITS), output_size=32, attention_heads=2,
        linear_units=64, num_blocks=2, dropout_rate=0.0, positional_dropout_rate=0.0,
        attention_dropout_rate=0.0, cnn_module_kernel=5, causal=True,
        cnn_module_norm="layer_norm",
    )


@dataclass(frozen=True)
class BenchModel:
    """The model under test and a sentence saying where it came from."""

    model: AsrModel
    source: str

    @property
    def config(self) -> ConformerConfig:
        return self.model.config


def load_bench_model(path: str | None = None, tiny: bool = False, seed: int = 0) -> BenchModel:
    """The model to benchmark.

    Args:
        path: a model directory; None = the bundled model, or a seeded random model of its
            architecture when it is not there yet.
        tiny: a seeded random tiny model (tests only).
        seed: seed of a random model's weights.
    """
    if path is not None:
        return BenchModel(_conformer(load_model(path), path), f"model from {path}")
    if not tiny and (DEFAULT_MODEL_DIR / "config.json").is_file():
        return BenchModel(_conformer(load_model(None), str(DEFAULT_MODEL_DIR)),
                          f"bundled default model ({DEFAULT_MODEL_DIR.name})")
    config = tiny_architecture() if tiny else bundled_architecture()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = AsrModel(config, units=list(BUNDLED_UNITS)).eval()
    torch.random.set_rng_state(generator_state)
    what = "tiny test model" if tiny else "bundled model's architecture (recipes/train.py)"
    return BenchModel(model, f"seeded random weights (seed {seed}), {what}; "
                             "the bundled checkpoint was not present")


def _conformer(model: object, path: str) -> AsrModel:
    """``model`` if it is a Conformer-CTC ``AsrModel`` (the dense baseline loop and the FLOP
    accounting are written for it)."""
    if not isinstance(model, AsrModel):
        raise ValueError(f"oasr bench measures Conformer-CTC models; {path} holds a "
                         f"{type(model).__name__}")
    return model


def default_audio_dir() -> Path:
    """``$OASR_BENCH_AUDIO``, else the shared dev set beside the repository."""
    env = os.environ.get(AUDIO_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "audio" / "devset"


def load_speech(audio_dir: Path, num_streams: int, seconds: float) -> list[np.ndarray]:
    """Per-stream 16 kHz float32 speech of ``seconds`` each.

    Stream i concatenates the dev-set files in sorted order starting at file i (mod the count),
    repeating as needed, so streams differ and every sample is real speech.

    Raises:
        FileNotFoundError: no .wav file in ``audio_dir``.
    """
    files = sorted(Path(audio_dir).glob("*.wav"))
    if not files:
        raise FileNotFoundError(
            f"no .wav files in {audio_dir}: pass --audio-dir or set ${AUDIO_DIR_ENV}")
    clips = [read_audio(f) for f in files]
    needed = int(seconds * MODEL_SAMPLE_RATE)
    streams = []
    for i in range(num_streams):
        parts, total, k = [], 0, i
        while total < needed:
            clip = clips[k % len(clips)]
            parts.append(clip)
            total += len(clip)
            k += 1
        streams.append(np.concatenate(parts)[:needed].astype(np.float32))
    return streams


def chunk_seconds(chunk_size: int) -> float:
    """Audio seconds one encoder chunk of ``chunk_size`` frames covers (0.64 s for 16)."""
    return chunk_size * CHUNK_SECONDS_PER_FRAME


def samples_for_frames(num_encoder_frames: int) -> int:
    """Audio samples a stream needs before it can yield ``num_encoder_frames`` encoder frames
    (conv2d 4x stem: 7 fbank frames for the first, 4 more each; fbank 25 ms / 10 ms)."""
    fbank_frames = (num_encoder_frames - 1) * 4 + 7
    return 400 + (fbank_frames - 1) * 160
