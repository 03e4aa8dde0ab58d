"""bench/final_window.py names the windows it compares on its command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from oasr.models.whisper.window import EncoderWindow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the script imports its siblings by name

import final_context  # noqa: E402
import final_window  # noqa: E402
import second_pass_parity  # noqa: E402


def test_windows_parse_from_their_names() -> None:
    assert final_window.parse_window("full") == EncoderWindow("full")
    assert final_window.parse_window("fit:2:0.5") == EncoderWindow("fit", 2.0, 0.5)
    assert final_window.parse_window("fit:1:2") == EncoderWindow("fit", 1.0, 2.0)
    # the default is the first window the script runs, so a run compares it unless told not to
    assert final_window.parse_window("fit:2:0.5") == EncoderWindow()


@pytest.mark.parametrize("text", ["fit:2", "half:2:2", "fit:a:1", "fit:-1:1"])
def test_a_bad_window_name_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"window '{text}'"):
        final_window.parse_window(text)


def test_several_stress_sets_are_pooled(tmp_path: Path) -> None:
    """--stress takes several stress_set.py directories (other seeds: more digit strings);
    every file of each is read, in order, under its own directory, its subset kept, before
    the devset's."""
    for seed, names in (("16", ("a.wav", "b.wav")), ("17", ("a.wav",))):
        folder = tmp_path / seed
        folder.mkdir()
        (folder / "manifest.tsv").write_text(
            "".join(f"{name}\tsynth_digits\tone {seed}\n" for name in names))
    devset = tmp_path / "dev"
    devset.mkdir()
    (devset / "manifest.tsv").write_text("real_x.wav\ttwo\n")
    parser = argparse.ArgumentParser()
    second_pass_parity.add_stress_argument(parser)
    stress = parser.parse_args(["--stress", str(tmp_path / "16"), str(tmp_path / "17")]).stress
    items = final_context.load_items(None, stress, devset, None)
    assert [(i.path, i.subset, i.reference) for i in items] == [
        (tmp_path / "16" / "a.wav", "synth_digits", "one 16"),
        (tmp_path / "16" / "b.wav", "synth_digits", "one 16"),
        (tmp_path / "17" / "a.wav", "synth_digits", "one 17"),
        (devset / "real_x.wav", "devset_real", "two"),
    ]
    assert parser.parse_args([]).stress == []
    assert final_context.load_items(None, [], None, None) == []
