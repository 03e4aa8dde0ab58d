"""bench/final_window.py names the windows it compares on its command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from oasr.models.whisper.window import EncoderWindow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the script imports its siblings by name

import final_window  # noqa: E402


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
