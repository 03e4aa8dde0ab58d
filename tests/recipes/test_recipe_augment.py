"""Augmentation: 16 kHz output, padding, loudness, clipping guard, determinism (needs sox)."""

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from recipes.augment import AugmentPlan, apply_augment, draw_plan

pytestmark = pytest.mark.skipif(shutil.which("sox") is None, reason="needs the sox binary")


def tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_clean_plan_resamples_pads_and_sets_loudness(tmp_path: Path) -> None:
    plan = AugmentPlan(pad_start_s=0.25, pad_end_s=0.5, rms_dbfs=-20.0)
    out = apply_augment(tone(22050, 1.0), 22050, plan, seed=1, tmp=tmp_path)
    assert abs(len(out) - 16000 * 1.75) <= 20
    speech = out[4000 + 100 : 4000 + 15900]
    rms_db = 20 * np.log10(np.sqrt(np.mean(speech**2)))
    assert abs(rms_db - (-20.0)) < 0.5
    assert np.abs(out[:3900]).max() < 1e-3  # padding holds only the faint floor


def test_augmented_plans_are_seeded_and_stay_in_range(tmp_path: Path) -> None:
    plans = [draw_plan(random.Random(s), augment=True) for s in range(30)]
    assert plans[4] == draw_plan(random.Random(4), augment=True)
    assert any(p.noise != "none" for p in plans) and any(p.tempo != 1.0 for p in plans)
    loud = AugmentPlan(tempo=1.1, reverb=40, telephone=True, via_8k=True, noise="pink",
                       snr_db=5.0, rms_dbfs=-3.0)
    a = apply_augment(tone(16000, 1.0), 16000, loud, seed=9, tmp=tmp_path)
    b = apply_augment(tone(16000, 1.0), 16000, loud, seed=9, tmp=tmp_path)
    assert np.abs(a).max() <= 0.99 + 1e-6
    np.testing.assert_array_equal(a, b)
