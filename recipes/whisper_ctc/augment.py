"""Speaker- and recording-variety augmentation of stored causal log-mel features, at training time.

Every transform works on one utterance's (T, 80) features of ``recipes.whisper_ctc.feats``, i.e. Whisper's
Slaney log-mel normalised as ``(log10(mel) + 4) / 4`` and floored at (the running maximum - 8),
and keeps that frontend's meaning:

- ``warp_mel``: a VTLP-style vocal-tract-length warp, frequency f heard as ``alpha * f``
  (piecewise linear so 0 and 8 kHz stay fixed), by interpolating between mel bins;
- ``band_limit``: bins above a cutoff set to the frame's floor, as audio resampled to 8 kHz gives;
- ``apply_gain``: a gain of g dB shifts every value by g / 40 (power log10 / 4), floors included;
- ``pad_silence`` / ``trim_quiet``: leading or trailing silence added or removed. Digital
  silence before the audio is exactly the constant ``SILENCE_VALUE`` (the 1e-10 floor), after it
  the utterance's final floor ``max - 2``: both what the causal frontend itself computes.
  Otherwise the utterance's own quiet frames (its noise floor) are resampled.

``augment_features`` draws all of them per utterance from a ``FeatureAugmentConfig`` (every
probability 0 by default, so a run without the flags is unchanged) and ``augmented_batch`` pads a
training batch of augmented utterances with SpecAugment on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recipes.data import Batch, FeatureSet, SpecAugmentConfig, collate, spec_augment

SAMPLE_RATE = 16000
SILENCE_VALUE = -1.5  # (log10(1e-10) + 4) / 4: digital zero through the causal log-mel
FLOOR_BELOW_MAX = 2.0  # the frontend's 8 log10 units of dynamic range, / 4
QUIET_BELOW_MAX = 0.75  # a frame whose loudest bin is 30 dB under the utterance peak is quiet
WARP_BOUNDARY_HZ = 4800.0  # VTLP: the warp is linear up to here, then bends to keep 8 kHz fixed


@dataclass(frozen=True)
class FeatureAugmentConfig:
    """Per-utterance augmentation probabilities and ranges (all off by default)."""

    warp_prob: float = 0.0
    warp_min: float = 0.88
    warp_max: float = 1.12
    band_limit_prob: float = 0.0
    band_limit_hz: tuple[float, float] = (3300.0, 4000.0)
    gain_prob: float = 0.0
    max_gain_db: float = 6.0
    lead_silence_prob: float = 0.0  # add leading silence, else (trim_prob) trim quiet lead
    trail_silence_prob: float = 0.0
    max_silence_frames: int = 60  # 0.6 s
    digital_silence_share: float = 0.5  # else resample the utterance's own quiet frames
    trim_prob: float = 0.0  # per edge, when no silence is added there
    min_quiet_frames: int = 10  # trimming keeps at least this many quiet frames at an edge

    def __post_init__(self) -> None:
        probs = {name: getattr(self, name) for name in (
            "warp_prob", "band_limit_prob", "gain_prob", "lead_silence_prob",
            "trail_silence_prob", "digital_silence_share", "trim_prob")}
        for name, p in probs.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if not 0.5 <= self.warp_min <= self.warp_max <= 1.5:
            raise ValueError(f"need 0.5 <= warp_min <= warp_max <= 1.5, got {self.warp_min}, "
                             f"{self.warp_max}")
        low, high = self.band_limit_hz
        if not 0 < low <= high < SAMPLE_RATE / 2:
            raise ValueError(f"band_limit_hz must satisfy 0 < low <= high < 8000, got {low}, {high}")
        if self.max_silence_frames < 0 or self.min_quiet_frames < 0 or self.max_gain_db < 0:
            raise ValueError(f"max_silence_frames {self.max_silence_frames}, min_quiet_frames "
                             f"{self.min_quiet_frames} and max_gain_db {self.max_gain_db} must be >= 0")

    @property
    def is_enabled(self) -> bool:
        return any(p > 0 for p in (self.warp_prob, self.band_limit_prob, self.gain_prob,
                                   self.lead_silence_prob, self.trail_silence_prob, self.trim_prob))


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale (linear to 1 kHz, logarithmic above), as Whisper's filterbank uses."""
    hz = np.asarray(hz, dtype=np.float64)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, log_part)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


def bin_centres_hz(num_bins: int) -> np.ndarray:
    """(num_bins,) centre frequencies of the filterbank's bands (0 to 8 kHz, Slaney spacing)."""
    edges = np.linspace(0.0, float(_hz_to_mel(np.array(SAMPLE_RATE / 2))), num_bins + 2)
    return _mel_to_hz(edges[1:-1])


def warp_mel(feats: np.ndarray, alpha: float) -> np.ndarray:
    """(T, M) features as if every frequency f were heard at ``alpha * f`` (VTLP).

    alpha > 1 moves formants up (a shorter vocal tract). Each output band reads the input at the
    source frequency of its centre, interpolated linearly between input bands.
    """
    num_bins = feats.shape[1]
    target = bin_centres_hz(num_bins)  # (M,)
    nyquist = SAMPLE_RATE / 2
    knee = WARP_BOUNDARY_HZ * min(alpha, 1.0) / alpha  # source frequency where the warp bends
    upper = knee + (target - alpha * knee) * (nyquist - knee) / (nyquist - alpha * knee)
    source_hz = np.where(target <= alpha * knee, target / alpha, upper)
    mel_step = float(_hz_to_mel(np.array(nyquist))) / (num_bins + 1)
    position = np.clip(_hz_to_mel(source_hz) / mel_step - 1.0, 0.0, num_bins - 1.0)  # (M,)
    lo = np.floor(position).astype(np.int64)
    hi = np.minimum(lo + 1, num_bins - 1)
    w = (position - lo).astype(feats.dtype)
    return feats[:, lo] * (1 - w) + feats[:, hi] * w


def frame_floors(feats: np.ndarray) -> np.ndarray:
    """(T,) the causal frontend's floor of each frame: running maximum - 2, at least silence."""
    running = np.maximum.accumulate(feats.max(axis=1))
    return np.maximum(running - FLOOR_BELOW_MAX, SILENCE_VALUE)


def band_limit(feats: np.ndarray, cutoff_hz: float) -> np.ndarray:
    """(T, M) with every band centred above ``cutoff_hz`` at its frame's floor (no energy)."""
    out = feats.copy()
    above = bin_centres_hz(feats.shape[1]) > cutoff_hz
    kept = out[:, ~above]
    out[:, above] = frame_floors(kept)[:, None]
    return out


def apply_gain(feats: np.ndarray, gain_db: float) -> np.ndarray:
    """(T, M) of the audio scaled by ``gain_db``; digital silence stays silence."""
    return np.maximum(feats + gain_db / 40.0, SILENCE_VALUE).astype(feats.dtype)


def quiet_edges(feats: np.ndarray) -> tuple[int, int]:
    """(leading, trailing) counts of quiet frames: 30 dB or more under the utterance peak."""
    loud = feats.max(axis=1) > feats.max() - QUIET_BELOW_MAX
    first, last = int(np.argmax(loud)), len(loud) - 1 - int(np.argmax(loud[::-1]))
    return first, len(loud) - 1 - last


def silence_frames(feats: np.ndarray, count: int, lead: bool, digital: bool,
                   rng: np.random.Generator) -> np.ndarray:
    """(count, M) silence for one edge: digital silence, or the edge's own quiet frames resampled
    (digital when that edge has fewer than 3 quiet frames)."""
    num_lead, num_trail = quiet_edges(feats)
    quiet = feats[:num_lead] if lead else feats[len(feats) - num_trail:]
    if digital or len(quiet) < 3:
        value = SILENCE_VALUE if lead else float(frame_floors(feats)[-1])
        return np.full((count, feats.shape[1]), value, dtype=feats.dtype)
    return quiet[rng.integers(0, len(quiet), size=count)]


def pad_silence(feats: np.ndarray, lead: int, trail: int, digital: bool,
                rng: np.random.Generator) -> np.ndarray:
    """(lead + T + trail, M): silence frames before and after the utterance."""
    parts = [silence_frames(feats, lead, True, digital, rng), feats,
             silence_frames(feats, trail, False, digital, rng)]
    return np.concatenate(parts, axis=0)


def trim_quiet(feats: np.ndarray, lead: int, trail: int, keep: int) -> np.ndarray:
    """Drop up to ``lead`` / ``trail`` quiet edge frames, keeping ``keep`` quiet frames each side."""
    num_lead, num_trail = quiet_edges(feats)
    start = min(lead, max(num_lead - keep, 0))
    stop = len(feats) - min(trail, max(num_trail - keep, 0))
    return feats[start:stop]


def _edges(feats: np.ndarray, cfg: FeatureAugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """Leading and trailing silence added, or quiet edges trimmed, each edge on its own draw."""
    digital = bool(rng.random() < cfg.digital_silence_share)
    add = [int(rng.integers(1, cfg.max_silence_frames + 1)) if rng.random() < p else 0
           for p in (cfg.lead_silence_prob, cfg.trail_silence_prob)]
    cut = [int(rng.integers(1, cfg.max_silence_frames + 1)) if not a and rng.random() < cfg.trim_prob
           else 0 for a in add]
    if any(cut):
        feats = trim_quiet(feats, cut[0], cut[1], cfg.min_quiet_frames)
    if any(add):
        feats = pad_silence(feats, add[0], add[1], digital, rng)
    return feats


def augment_features(feats: np.ndarray, cfg: FeatureAugmentConfig,
                     rng: np.random.Generator) -> np.ndarray:
    """One utterance's (T, 80) features -> augmented (T', 80): edges, warp, band limit, gain."""
    out = _edges(feats, cfg, rng)
    if rng.random() < cfg.warp_prob:
        out = warp_mel(out, float(rng.uniform(cfg.warp_min, cfg.warp_max)))
    if rng.random() < cfg.band_limit_prob:
        out = band_limit(out, float(rng.uniform(*cfg.band_limit_hz)))
    if rng.random() < cfg.gain_prob:
        out = apply_gain(out, float(rng.uniform(-cfg.max_gain_db, cfg.max_gain_db)))
    return out.astype(np.float32)


def augmented_batch(data: FeatureSet, indices: list[int], cfg: FeatureAugmentConfig,
                    spec: SpecAugmentConfig | None, fill: np.ndarray,
                    rng: np.random.Generator) -> Batch:
    """``data.make_batch`` with ``augment_features`` applied to each utterance before SpecAugment.

    Returns a Batch: feats (B, T, 80), feat_lens (B,), targets (B, U), target_lens (B,).
    """
    feats = [augment_features(data.features(i), cfg, rng) for i in indices]
    if spec is not None:
        feats = [spec_augment(f, spec, fill, rng) for f in feats]
    return collate(feats, [data.tokens[i] for i in indices])
