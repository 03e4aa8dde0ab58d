"""What every benchmark runs on: one model, real speech, and the per-family facts built from them.

The model is the bundled default when it exists (its family picked from its ``config.json``),
else a seeded random model of that family's bundled architecture: speed does not depend on
trained weights, and the report says which one ran. Both encoder families are served: the
Conformer-CTC (fbank, 40 ms frames, chunk 16) and the Whisper-CTC (causal log-mel, 20 ms frames,
chunk 32, at most ``max_positions`` frames per stream). Input audio is real speech from the dev
set, each stream a different rotation of its files so no two streams carry identical samples.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from oasr.audio import (
    MODEL_SAMPLE_RATE,
    ChunkGeometry,
    FrameEnergy,
    compute_fbank,
    read_audio,
    split_windows,
)
from oasr.audio.energy import ENERGY_FLOOR_DB
from oasr.engine.config import EngineConfig
from oasr.engine.families import ModelFamily, family_for
from oasr.engine.options import default_ctc_top_k
from oasr.lm import has_word_lm
from oasr.models import AsrModel, ConformerConfig, load_model
from oasr.models.bundled import BUNDLED_UNITS, bundled_architecture
from oasr.models.checkpoint import CONFORMER_CTC, DEFAULT_MODEL_DIR, WHISPER_CTC, model_family_of
from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, causal_log_mel

AUDIO_DIR_ENV = "OASR_BENCH_AUDIO"
DEVSET_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "audio" / "devset"
"""The dev set in a source checkout (``tests/data/audio/devset``: 28 short English recordings,
16 kHz mono WAV, with ``manifest.tsv``): the benchmarks' default speech, and where the ``bench/``
scripts find it. An installed package has no such folder; pass an audio directory there
(``--audio-dir``, ``$OASR_BENCH_AUDIO``)."""
FAMILIES = (CONFORMER_CTC, WHISPER_CTC)
FAMILY_CHOICES = {"conformer": CONFORMER_CTC, CONFORMER_CTC: CONFORMER_CTC,
                  WHISPER_CTC: WHISPER_CTC}
HOP_SAMPLES = 160  # both frontends: one feature frame every 10 ms
# feature frame i of a stream is complete once 160 i + this many samples have arrived:
# kaldi fbank frames span [160 i, 160 i + 400); causal log-mel frames [160 i - 200, 160 i + 200)
# icefall fbank (no snip_edges) frames are centred: [160 i - 120, 160 i + 280)
FRAME_COMPLETE_SAMPLES = {CONFORMER_CTC: 400, WHISPER_CTC: 200, "zipformer": 280}


def tiny_architecture() -> ConformerConfig:
    """A 2-block, 32-wide Conformer: for tests of the benchmark machinery, never for numbers."""
    return ConformerConfig(
        input_dim=80, vocab_size=len(BUNDLED_UNITS), output_size=32, attention_heads=2,
        linear_units=64, num_blocks=2, dropout_rate=0.0, positional_dropout_rate=0.0,
        attention_dropout_rate=0.0, cnn_module_kernel=5, causal=True,
        cnn_module_norm="layer_norm",
    )


def tiny_whisper_architecture() -> WhisperCtcConfig:
    """A 2-layer, 32-wide Whisper-CTC (chunk 32, 1500 positions): tests only."""
    return WhisperCtcConfig(width=32, heads=2, layers=2)


@dataclass(frozen=True)
class BenchModel:
    """The model under test, a sentence saying where it came from, how it is decoded, and
    its family's facts.

    Attributes:
        model: the model.
        source: where it came from, in words (the report's).
        model_dir: the directory it was loaded from (its LMs are the server's); None for
            random weights.
        beam: the CTC beam the engine and the dense loop decode with: 1 greedy; wider, a
            prefix beam search with ``model_dir``'s LMs when it has them (`with_decoding`).
    """

    model: nn.Module
    source: str
    model_dir: Path | None = None
    beam: int = 1

    def with_decoding(self, config: EngineConfig) -> EngineConfig:
        """``config`` decoding as this bench does: its ``beam`` (with the commands' tokens per
        frame, `default_ctc_top_k`), and the model directory's LMs with a beam (``lm``
        "auto"), none without a directory or a beam."""
        lms = self.model_dir is not None and self.beam > 1
        return dataclasses.replace(
            config, decoder=dataclasses.replace(config.decoder, beam_size=self.beam,
                                                top_k=default_ctc_top_k(self.beam)),
            lm="auto" if lms else "none",
            model=str(self.model_dir) if self.model_dir is not None else config.model)

    @property
    def decoding(self) -> dict[str, object]:
        """What the report says of the decoding: the beam and the LMs it fuses."""
        if self.family.decoding == "transducer":
            search = "transducer greedy" if self.beam == 1 else "transducer modified beam search"
            return {"beam": self.beam, "lms": "none", "search": search}
        if self.beam == 1:
            return {"beam": 1, "lms": "none", "search": "CTC greedy"}
        config = self.with_decoding(EngineConfig())
        lm_dir = None if self.model_dir is None else config.resolve_lm_dir(self.model_dir)
        lms = "none" if lm_dir is None else "char + word" if has_word_lm(lm_dir) else "char"
        return {"beam": self.beam, "lms": lms, "search": "CTC prefix beam search",
                "tokens_per_frame": config.decoder.top_k}

    @functools.cached_property
    def family(self) -> ModelFamily:
        """The engine's adapter for this model (`family_for`)."""
        return family_for(self.model)

    @property
    def family_name(self) -> str:
        """``"conformer_ctc"`` or ``"whisper_ctc"``."""
        return self.family.name

    @property
    def config(self) -> ConformerConfig | WhisperCtcConfig:
        return self.model.config  # type: ignore[return-value]

    @property
    def chunk_size(self) -> int:
        """Encoder frames per chunk: the model's trained chunk (640 ms in both families)."""
        return self.family.default_chunk_size

    @property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame (0.04 Conformer, 0.02 Whisper-CTC)."""
        return self.family.timing.frame_shift_s

    @property
    def chunk_seconds(self) -> float:
        """Audio seconds one chunk covers (0.64 s for both bundled architectures)."""
        return self.chunk_size * self.frame_seconds

    @property
    def chunk_samples(self) -> int:
        """16 kHz samples per chunk (10,240)."""
        return round(self.chunk_seconds * MODEL_SAMPLE_RATE)

    @property
    def max_chunks(self) -> int | None:
        """Full chunks a stream can run before its positions run out (46 for 1500 positions
        and chunk 32); None: no limit (the Conformer's relative positions)."""
        limit = self.family.max_positions
        return None if limit is None else limit // self.chunk_size

    @property
    def chunk_geometry(self) -> ChunkGeometry:
        """How a chunk maps onto feature frames (67 every 64 Conformer; 64 every 64 Whisper)."""
        return self.family.chunk_geometry(self.chunk_size)

    def samples_for_frames(self, num_encoder_frames: int) -> int:
        """Audio samples a stream needs before it can yield ``num_encoder_frames`` frames
        (Conformer: 400 + 160 (4n + 2); Whisper-CTC: 200 + 160 (2n - 1))."""
        geometry = self.chunk_geometry
        last = (num_encoder_frames - 1) * geometry.subsampling + geometry.right_context
        return FRAME_COMPLETE_SAMPLES[self.family_name] + HOP_SAMPLES * last

    def features(self, samples: np.ndarray) -> np.ndarray:
        """The family's features of a whole utterance: (N,) float32 -> (F, 80) float32."""
        if self.family_name == WHISPER_CTC:
            return causal_log_mel(samples, self.config.n_mels)  # type: ignore[union-attr]
        if self.family_name == "zipformer":
            from oasr.models.zipformer.features import ICEFALL_FBANK

            return compute_fbank(samples, ICEFALL_FBANK)
        return compute_fbank(samples)

    def windows(self, feats: np.ndarray) -> list[np.ndarray]:
        """Every chunk window of an utterance's features, (window, F) each."""
        return split_windows(feats, self.chunk_geometry)


def _random_model(family: str, tiny: bool, seed: int) -> nn.Module:
    """A seeded random model of ``family``'s bundled (or tiny) architecture, eval mode. The
    Whisper-CTC position table is random too, so a stream's offset changes its output."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model: nn.Module
    if family == WHISPER_CTC:
        model = WhisperCtcModel(tiny_whisper_architecture() if tiny else WhisperCtcConfig())
        with torch.no_grad():
            model.positions.normal_(0.0, 0.5)
        model.units = BUNDLED_UNITS
    else:
        model = AsrModel(tiny_architecture() if tiny else bundled_architecture(),
                         units=list(BUNDLED_UNITS))
    torch.random.set_rng_state(generator_state)
    return model.eval()


def bundled_family() -> str:
    """The bundled default model's family (its config.json), Conformer-CTC when it is absent."""
    if (DEFAULT_MODEL_DIR / "config.json").is_file():
        return model_family_of(DEFAULT_MODEL_DIR)
    return CONFORMER_CTC


def resolve_family(name: str | None) -> str:
    """A ``--family`` value as a family id; None = the bundled model's family.

    Raises:
        ValueError: an unknown name.
    """
    if name is None:
        return bundled_family()
    if name not in FAMILY_CHOICES:
        raise ValueError(f"unknown model family {name!r}: choose conformer or whisper_ctc")
    return FAMILY_CHOICES[name]


def load_bench_model(path: str | None = None, tiny: bool = False, seed: int = 0,
                     family: str | None = None, beam: int | None = None) -> BenchModel:
    """The model to benchmark.

    Args:
        path: a model directory (its family comes from the model); None = the bundled model
            when it is of ``family``, else a seeded random model of ``family``'s architecture.
        tiny: a seeded random tiny model of ``family`` (tests only).
        seed: seed of a random model's weights.
        family: ``conformer`` / ``conformer_ctc`` / ``whisper_ctc``; None = the bundled
            model's family.
        beam: the CTC beam to decode with; None = the server's for this model
            (`served_beam`: 16 with the directory's LMs, greedy without them).
    Raises:
        ValueError: ``path`` holds a model of another family than ``family``, or a beam < 1.
    """
    if beam is not None and beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if path is not None:
        bench = BenchModel(load_model(path), f"model from {path}", Path(path),
                           beam or served_beam(Path(path)))
        if family is not None and bench.family_name != resolve_family(family):
            raise ValueError(f"{path} holds a {bench.family_name} model, not --family {family}")
        return bench
    wanted = resolve_family(family)
    if not tiny and (DEFAULT_MODEL_DIR / "config.json").is_file() and bundled_family() == wanted:
        return BenchModel(load_model(None), f"bundled default model ({DEFAULT_MODEL_DIR.name})",
                          DEFAULT_MODEL_DIR, beam or served_beam(DEFAULT_MODEL_DIR))
    if tiny:
        what = f"tiny {wanted} test model"
    elif wanted == WHISPER_CTC:
        what = "Whisper-CTC architecture (WhisperCtcConfig(): tiny.en encoder, 4 x 384)"
    else:
        what = "bundled Conformer architecture (recipes/conformer/train.py)"
    why = "" if tiny else f"; the bundled checkpoint is not a {wanted} model"
    return BenchModel(_random_model(wanted, tiny, seed),
                      f"seeded random weights (seed {seed}), {what}{why}", beam=beam or 1)


def served_beam(model_dir: Path) -> int:
    """The CTC beam ``oasr-server`` decodes a model directory's streams with by default: a
    beam with the directory's LMs when it has a char LM, else greedy
    (`oasr.engine.options.default_beam_size`)."""
    from oasr.engine.options import default_beam_size

    return default_beam_size(str(model_dir), "auto")


def default_audio_dir() -> Path:
    """``$OASR_BENCH_AUDIO``, else the dev set in the repository (`DEVSET_DIR`)."""
    env = os.environ.get(AUDIO_DIR_ENV)
    if env:
        return Path(env)
    return DEVSET_DIR


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


# a real recording's speech ends at its last 10 ms frame this far above its floor (its room
# tone; `speech_bounds`)
ROOM_ABOVE_FLOOR_DB = 12.0
FLOOR_PERCENTILE = 10  # a recording's floor: its 10th-percentile 10 ms frame


def speech_bounds(audio: np.ndarray, threshold_db: float = -40.0,
                  above_floor_db: float | None = None) -> tuple[int, int]:
    """The samples ``[start, end)`` from the first to the last 10 ms frame of a recording
    within ``threshold_db`` of its loudest frame: its speech, leading and trailing digital
    silence left out ((0, 0) for no audio). With ``above_floor_db``, a frame must also be that
    much louder than the recording's floor (its 10th-percentile frame), when it has a quieter
    part than that: a real recording's room tone, 30-35 dB under its words, is left out too."""
    hop = MODEL_SAMPLE_RATE // 100
    db = _frame_db(audio)
    if not len(db):
        return 0, 0
    threshold = db.max() + threshold_db
    floor = float(np.percentile(db, FLOOR_PERCENTILE))
    if above_floor_db is not None and db.max() - floor > above_floor_db:  # (else no quiet part)
        threshold = max(threshold, floor + above_floor_db)
    loud = np.flatnonzero(db > threshold)
    if not loud.size:
        return 0, 0
    return int(loud[0]) * hop, (int(loud[-1]) + 1) * hop


def _frame_db(audio: np.ndarray) -> np.ndarray:
    """``audio``'s energy per 10 ms frame, in dB full scale (`FrameEnergy`)."""
    energy = FrameEnergy(MODEL_SAMPLE_RATE // 100)
    energy.append(audio)
    return energy.values


def room_of(audio: np.ndarray, min_s: float = 0.1) -> np.ndarray | None:
    """A recording's own room tone: the 10 ms frames of its audio after its last word
    (before its first when that is shorter than ``min_s``; `speech_bounds` 12 dB above its
    floor) no louder than their median + 3 dB (a breath or the word's fade left out), joined;
    None where that is shorter than ``min_s`` or digital silence (a TTS voice, a noise-gated
    source)."""
    lo, hi = speech_bounds(audio, above_floor_db=ROOM_ABOVE_FLOOR_DB)
    shortest = min_s * MODEL_SAMPLE_RATE
    room = audio[hi:] if len(audio) - hi >= shortest else audio[:lo]
    hop = MODEL_SAMPLE_RATE // 100
    db = _frame_db(room)
    if len(room) < shortest or not len(db) or float(np.median(db)) <= ENERGY_FLOOR_DB + 1.0:
        return None
    frames = room[: len(db) * hop].reshape(len(db), hop)
    return frames[db <= np.median(db) + 3.0].ravel().astype(np.float32)


def pink_noise(rng: np.random.Generator, num_samples: int) -> np.ndarray:
    """``num_samples`` of pink (1/f power) noise at unit RMS, float64."""
    if num_samples == 0:
        return np.zeros(0)
    spectrum = np.fft.rfft(rng.standard_normal(num_samples))
    spectrum /= np.sqrt(np.maximum(np.arange(spectrum.size), 1))  # 1/f power
    noise = np.fft.irfft(spectrum, n=num_samples)
    return noise / np.sqrt(float(np.mean(np.square(noise))))


def room_tone(rng: np.random.Generator, num_samples: int, room: np.ndarray | None,
              window: int = 512) -> np.ndarray:
    """A pause as a microphone in a room records it: ``num_samples`` of noise with a
    recording's own room tone's level and spectrum (`room_of`: its average power spectrum
    over ``window``-sample Hann windows), so that the room tone a recording keeps after its
    last word goes on through the pause instead of stopping at digital silence (which no
    open microphone sends, and against which that room tone stands out as sound). Noise of
    another colour at the same level is no stand-in: with pink noise in the devset's pauses
    Whisper read its LibriVox reader's "ill-disposed" as "old supposed", and right with this.
    Digital silence for ``room`` None."""
    if room is None or num_samples == 0:
        return np.zeros(num_samples, np.float32)
    taper = np.hanning(min(window, len(room)))
    step = len(taper) // 2
    power = np.mean([np.abs(np.fft.rfft(room[i: i + len(taper)] * taper)) ** 2
                     for i in range(0, len(room) - len(taper) + 1, step)], axis=0)
    spectrum = np.fft.rfft(rng.standard_normal(num_samples))
    spectrum *= np.interp(np.linspace(0.0, 1.0, spectrum.size),
                          np.linspace(0.0, 1.0, power.size), np.sqrt(power))
    noise = np.fft.irfft(spectrum, n=num_samples)
    level = np.sqrt(np.mean(np.square(room.astype(np.float64))))
    return (noise * level / max(float(np.sqrt(np.mean(np.square(noise)))), 1e-12)).astype(np.float32)
