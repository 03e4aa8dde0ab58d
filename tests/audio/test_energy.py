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


def test_reads_between_appends_see_every_frame_completed_so_far():
    """A read after any piece counts the frames the samples so far complete (an unfinished
    frame's samples carried to the next piece), and the values equal those of the audio
    appended whole, also after frames were discarded."""
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(3000) * 0.05).astype(np.float32)
    whole, read_often = FrameEnergy(320), FrameEnergy(320)
    whole.append(audio)
    for lo in range(0, len(audio), 250):
        read_often.append(audio[lo: lo + 250])
        if lo % 500 == 0:
            assert read_often.num_frames == min(lo + 250, len(audio)) // 320
    assert read_often.num_frames == whole.num_frames == 9
    np.testing.assert_allclose(read_often.values, whole.values, atol=1e-4)
    read_often.discard_before(3)
    read_often.append(audio[:640])  # 3,640 samples: frames 9 and 10 complete
    assert len(read_often.span(0, 100)) == 11 - 3
    longer = FrameEnergy(320)
    longer.append(np.concatenate([audio, audio[:640]]))
    np.testing.assert_allclose(read_often.span(9, 11), longer.values[9:11], atol=1e-4)


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
