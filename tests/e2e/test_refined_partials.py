"""Refined partials on the page: while a fake microphone plays a real recording, the live line
shows stable words (committed by the Whisper refinements, never changed afterwards) and
tentative / CTC words after them; the final begins with the words that were stable."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr
from demo_page import CHROMIUM, DemoPage, browser_args

from oasr.text.wer import normalize_transcript, word_error_rate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                       reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]

PASSAGE = ("real_sense_and_sensibility_01_austen_64kb-0870.wav",
           "real_sense_and_sensibility_01_austen_64kb-0880.wav")
_SAMPLE_JS = """
() => [...document.querySelectorAll("#transcript .segment")].map((line) => ({
  segment: Number(line.dataset.segment),
  final: line.classList.contains("final"),
  stable: line.querySelector(".stable")?.textContent || "",
  tentative: line.querySelector(".tentative")?.textContent || "",
  ctc: line.querySelector(".ctc")?.textContent || "",
  text: line.querySelector(".words")?.textContent || line.textContent,
}))
"""


@pytest.fixture(scope="module")
def recording(devset_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two LibriVox sentences read one after the other (9 s), at 48 kHz, with a silent tail."""
    manifest = dict(line.split("\t") for line in
                    (devset_dir / "manifest.tsv").read_text().splitlines())
    parts = [soundfile.read(str(devset_dir / name), dtype="float32")[0] for name in PASSAGE]
    pause = np.zeros(int(0.3 * 16000), dtype=np.float32)
    audio = np.concatenate([pause, parts[0], pause, parts[1], np.zeros(16000, np.float32)])
    path = tmp_path_factory.mktemp("passage") / "passage_48k.wav"
    soundfile.write(str(path), soxr.resample(audio, 16000, 48000), 48000, subtype="PCM_16")
    return path, " ".join(manifest[name] for name in PASSAGE)


@pytest.fixture(scope="module")
def refining_server(start_module_server: Any, bundled_model_dir: Path) -> Any:
    # the browser, its driver and the server share this machine's cores, as in a demo on
    # one small machine: at the default nice 10 (a server's: partials first at many streams)
    # Chromium's processes take the second pass's time, and on a slow 2-core box no two
    # refinements agreed before the final; the README advises --second-pass-nice 0 for that
    # words stable by agreement alone: with the default confidence floor most of a segment
    # stays tentative until its final, and this test is about showing stable words
    return start_module_server(None, "--second-pass", "whisper", "--max-batch-size", "2",
                               "--max-num-blocks", "128", "--threads", "1",
                               "--second-pass-nice", "0", "--refine-min-word-prob", "0")


@pytest.fixture
def page(refining_server: Any, tmp_path: Path, recording: tuple[Path, str]) -> Iterator[DemoPage]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=browser_args(recording[0]))
        yield DemoPage(context.new_page(), refining_server.url, tmp_path)
        context.close()
    refining_server.wait_until_idle(timeout_s=60)


def test_stable_and_tentative_text_while_a_real_recording_plays(
        page: DemoPage, recording: tuple[Path, str], refining_server: Any) -> None:
    capture, reference = recording
    page.start_mic()
    page.wait_listening()
    seconds = soundfile.info(str(capture)).duration
    samples: list[list[dict[str, Any]]] = []
    deadline = time.monotonic() + seconds + 0.5
    while time.monotonic() < deadline:
        samples.append(page.page.evaluate(_SAMPLE_JS))
        time.sleep(0.1)
    page.screenshot("refined_partials")
    page.stop_mic()
    # the lines go on changing until their finals (a slow CPU's refinements commit late)
    deadline = time.monotonic() + 120
    while page.done_note().count() == 0 and time.monotonic() < deadline:
        samples.append(page.page.evaluate(_SAMPLE_JS))
        time.sleep(0.1)
    page.wait_done(timeout_ms=1_000)
    finals = {line["segment"]: line["text"] for line in page.page.evaluate(_SAMPLE_JS)
              if line["final"]}

    live = [line for sample in samples for line in sample if not line["final"]]
    assert any(line["stable"] for line in live), "no committed (stable) words were shown"
    assert any(line["stable"] and (line["tentative"] or line["ctc"]) for line in live), (
        "stable words were never followed by tentative or CTC words")
    for segment in {line["segment"] for line in live}:
        shown = [line["stable"].split() for line in live if line["segment"] == segment]
        for earlier, later in zip(shown, shown[1:], strict=False):
            assert later[: len(earlier)] == earlier, (earlier, later)  # never changed
        # a segment whose final is empty (no speech in it) has no line: it showed no stable words
        final_words = finals.get(segment, "").split()
        assert final_words[: len(shown[-1])] == shown[-1], (shown[-1], final_words)
    text = " ".join(finals[s] for s in sorted(finals))
    assert word_error_rate(reference, text) <= 0.15, (normalize_transcript(text), reference)
    # the server's default: Whisper in two processes where there are two cores
    second = refining_server.stats()["second_pass"]
    assert second["num_decoders"] == min(2, os.cpu_count() or 1)
    assert second["num_second_pass_finals"] > 0  # decoded there
