"""FrameEnergy: one dB value per encoder frame, whatever the pieces the audio came in."""

import numpy as np
import pytest

from oasr.audio import FrameEnergy


def test_energy_per_frame_in_db_independent_of_piece_sizes():
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(320), 0.1 * np.ones(320), rng.standard_normal(650) * 0.01])
    whole, pieces = FrameEnergy(320), FrameEnergy(320)
    whole.append(audio.astype(np.float32))
    for lo in range(0, len(audio), 77):
        pieces.append(audio[lo: lo + 77].astype(np.float32))
    assert whole.num_frames == pieces.num_frames == 4  # 1290 samples: 4 whole frames
    np.testing.assert_allclose(whole.values, pieces.values, atol=1e-4)
    assert whole.values[0] == pytest.approx(-100.0)  # digital silence: the floor
    assert whole.values[1] == pytest.approx(-20.0, abs=1e-3)  # 0.1 full scale


def test_discard_and_span_use_absolute_frames():
    energy = FrameEnergy(10)
    energy.append(np.arange(100, dtype=np.float32) / 100)  # 10 frames
    energy.discard_before(4)
    assert energy.first_frame == 4 and energy.num_frames == 10
    assert len(energy.span(0, 6)) == 2  # frames 4 and 5 are held
    assert len(energy.span(8, 20)) == 2
    energy.discard_before(2)  # already gone: a no-op
    assert energy.first_frame == 4
    with pytest.raises(ValueError, match="samples_per_frame must be >= 1, got 0"):
        FrameEnergy(0)
