"""The evaluation's devset reader: leading silence moves the frames, not the speech's features."""

from pathlib import Path

import numpy as np
import soundfile as sf

from recipes.whisper_ctc.evaluate import devset_utterances


def test_leading_silence_prepends_frames_and_keeps_the_rest(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    speech = (0.3 * np.sin(2 * np.pi * 220 * t) * (t > 0.3) + 0.01 * rng.standard_normal(16000))
    sf.write(tmp_path / "real_a.wav", speech.astype(np.float32), 16000, subtype="FLOAT")
    sf.write(tmp_path / "tts_b.wav", speech.astype(np.float32), 16000, subtype="FLOAT")
    (tmp_path / "manifest.tsv").write_text("real_a.wav\thello there\ntts_b.wav\tother\n")
    [(name, plain, ref)] = devset_utterances(tmp_path, "real_")
    [(_, shifted, _)] = devset_utterances(tmp_path, "real_", lead_silence_s=0.2)
    assert (name, ref) == ("real_a.wav", "hello there")
    assert len(shifted) == len(plain) + 20  # 0.2 s of 10 ms frames
    # the speech's frames are unchanged: silence never raises the running maximum
    np.testing.assert_allclose(shifted[20:], plain, atol=1e-5)
    assert shifted[:15].max() <= shifted[40:].min() + 1e-6
