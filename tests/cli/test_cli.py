"""The ``oasr`` command line: transcribe through the engine, export a WeNet dir."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from support.paths import DEVSET_DIR, WENET_FIXTURE_DIR
from tqdm import TqdmWarning

from oasr.cli import main
from oasr.engine import EngineConfig, transcribe_files
from oasr.engine.options import (
    ENGINE_FLAGS,
    add_engine_arguments,
    command_engine_config,
    engine_config_from_args,
)
from oasr.models import AsrModel, ConformerConfig, load_model, save_model

UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "▁", "<sos/eos>"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    config = ConformerConfig(vocab_size=len(UNITS), output_size=32, attention_heads=2,
                             linear_units=64, num_blocks=2, cnn_module_kernel=7)
    return save_model(AsrModel(config, units=UNITS), tmp_path_factory.mktemp("cli_model"))


def test_transcribe_json_matches_the_engine(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [DEVSET_DIR / "tts_01.wav", DEVSET_DIR / "real_george_1.wav"]
    code = main(["transcribe", "--json", "--no-progress", "--model", str(model_dir),
                 "--device", "cpu", "--second-pass", "none", *map(str, files)])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = transcribe_files(EngineConfig(model=str(model_dir), device="cpu",
                                             max_wait_time_s=60.0), files, progress=False)
    assert [d["file"] for d in lines] == [str(f) for f in files]
    assert [d["text"] for d in lines] == [r.text for r in expected]
    assert all(d["finish_reason"] == "stop" for d in lines)
    assert all(set(s) == {"text", "start", "end", "reason", "source"}
               for d in lines for s in d["segments"])
    assert {s["source"] for d in lines for s in d["segments"]} <= {"ctc"}  # no second pass


def test_transcribe_progress_never_passes_the_audio_total() -> None:
    """The engine counts each stream's last chunk in full (the bundled model's 640 ms ones
    overshoot these files' 9.9 s); the bar stops at the files' total instead of warning that
    it ran past it."""
    files = [DEVSET_DIR / "real_george_0.wav", DEVSET_DIR / "real_jackson_0.wav"]
    config = EngineConfig(device="cpu", max_wait_time_s=60.0)  # the bundled model
    with warnings.catch_warnings():
        warnings.simplefilter("error", TqdmWarning)
        results = transcribe_files(config, files, progress=True)
    assert all(r.finish_reason == "stop" for r in results)


def test_transcribe_missing_file_is_a_clear_error(model_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", "--model", str(model_dir), "/nonexistent.wav"]) == 2
    assert "no such file: /nonexistent.wav" in capsys.readouterr().err


def test_transcribe_flag_out_of_range_is_a_clear_error(model_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "quiet.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    assert main(["transcribe", "--model", str(model_dir), "--max-batch-size", "0",
                 str(wav)]) == 2
    assert "oasr transcribe: EngineConfig.max_batch_size must be >= 1" in capsys.readouterr().err
    assert main(["transcribe", "--model", str(model_dir), "--second-pass-processes", "2",
                 str(wav)]) == 2
    assert "needs second_pass_process" in capsys.readouterr().err


def test_export_wenet_dir(tmp_path: Path) -> None:
    wenet = tmp_path / "wenet_exp"
    wenet.mkdir()
    shutil.copy(WENET_FIXTURE_DIR / "train.yaml", wenet / "train.yaml")
    shutil.copy(WENET_FIXTURE_DIR / "global_cmvn.json", wenet / "global_cmvn.json")
    state = torch.load(WENET_FIXTURE_DIR / "state_dict_fp16.pt", map_location="cpu")
    torch.save({k: v.float() for k, v in state.items()}, wenet / "final.pt")
    units = ["<blank>", "<unk>", *[chr(ord("a") + i) for i in range(29)], "<sos/eos>"]
    (wenet / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units)))
    out = tmp_path / "oasr_model"
    result = subprocess.run([sys.executable, "-m", "oasr.cli", "export", str(wenet), str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "config.json", "units.txt"}
    a, b = load_model(wenet), load_model(out)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert b.units == units


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, save_whisper_ctc

    torch.manual_seed(1)
    model = WhisperCtcModel(WhisperCtcConfig(width=32, heads=2, layers=2)).eval()
    with torch.no_grad():  # random positions: the output changes along the utterance
        model.positions.copy_(torch.randn_like(model.positions))
    return save_whisper_ctc(model, tmp_path_factory.mktemp("cli_wctc"))


def test_transcribe_a_whisper_ctc_dir(whisper_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same path with the second encoder family: its 20 ms frames time the segments."""
    from oasr.audio import read_audio

    files = [DEVSET_DIR / "tts_01.wav"]
    code = main(["transcribe", "--json", "--no-progress", "--model", str(whisper_dir),
                 "--device", "cpu", "--second-pass", "none", *map(str, files)])
    assert code == 0
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = transcribe_files(EngineConfig(model=str(whisper_dir), device="cpu",
                                             max_wait_time_s=60.0), files, progress=False)
    assert line["text"] == expected[0].text and line["text"]
    duration = len(read_audio(files[0])) / 16000
    ends = [s["end"] for s in line["segments"]]
    assert max(ends) <= duration + 0.02
    assert max(ends) > 0.5 * duration  # 40 ms frames would put noise past the end


def test_transcribe_decodes_finals_in_full_with_context_and_the_server_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # offline nothing waits on a final: every one in full (never the live server's fast
    # rule), after its predecessor's text, none early; a live server keeps finals batchable
    from oasr.engine import offline
    from oasr.engine.options import OFFLINE_FINAL_CONTEXT_S

    seen: list[EngineConfig] = []
    monkeypatch.setattr(offline, "transcribe_files",
                        lambda config, files, progress, **bias: seen.append(config) or [])
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"")
    assert main(["transcribe", str(audio), "--no-progress"]) == 0
    assert main(["transcribe", str(audio), "--no-progress", "--final-context", "0"]) == 0
    offline, no_context = seen
    assert offline.second_pass_fast_backlog is None and offline.early_final_s == 0
    assert offline.final_context_s == OFFLINE_FINAL_CONTEXT_S
    assert no_context.final_context_s == 0
    # offline --final-context decides at any load: no context means none at the tail either
    assert offline.light_load_context_s == no_context.light_load_context_s == 0
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    live = engine_config_from_args(parser.parse_args([]))
    assert live.final_context_s == 0 and live.second_pass_fast_backlog == 2
    assert live.light_load_context_s == EngineConfig.light_load_context_s > 0
    assert engine_config_from_args(parser.parse_args(
        ["--light-load-context", "0"])).light_load_context_s == 0
    assert live.early_final_s == EngineConfig.early_final_s > 0
    assert live.sentence_end_s == 0.5  # a sentence's end ends its segment at 0.5 s of pause
    assert engine_config_from_args(parser.parse_args(
        ["--sentence-end", "0"])).sentence_end_s == 0  # only the endpoint rules
    with pytest.raises(ValueError, match="sentence_end_s"):
        engine_config_from_args(parser.parse_args(["--sentence-end", "-1"]))
    assert live.light_load_streams is None and live.resolved_light_load_streams == 2
    two = engine_config_from_args(parser.parse_args(["--second-pass-process",
                                                     "--second-pass-processes", "2"]))
    assert two.resolved_light_load_streams == 4  # 2 per second-pass process
    demo = engine_config_from_args(parser.parse_args(["--light-load-streams", "3",
                                                      "--second-pass-processes", "1"]))
    assert demo.resolved_light_load_streams == 3
    with pytest.raises(ValueError, match="light_load_streams"):
        engine_config_from_args(parser.parse_args(["--light-load-streams", "-1"]))


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "oasr.cli", "transcribe", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_transcribe_help_lists_the_common_flags_and_help_all_every_flag() -> None:
    short, full = _help("--help"), _help("--help-all")
    shown = re.findall(r"^  (?:-\w, )?(--[a-z0-9-]+)", short, re.M)
    every = re.findall(r"^  (?:-\w, )?(--[a-z0-9-]+)", full, re.M)
    assert len(shown) <= 25, shown
    assert {"--model", "--device", "--dtype", "--threads", "--json", "--help-all"} <= set(shown)
    assert set(every) == {"--help", "--help-all", "--json", "--no-progress", "--hotwords",
                          "--prompt", *(f.flag for f in ENGINE_FLAGS)}
    assert "--refine-hold-words" not in short and "--refine-hold-words N" in full


def test_every_transcribe_flag_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`(--[a-z0-9-]+)", doc))
    assert {"--json", "--no-progress", "--hotwords", "--prompt",
            *(f.flag for f in ENGINE_FLAGS)} <= documented


def test_an_engine_flag_left_out_keeps_the_base_configs_field() -> None:
    """A flag's default is its field's value in the base config (one source of defaults):
    no flag changes nothing but what the model decides (the beam width, and with it the
    tokens a frame may extend a prefix by)."""
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    base = replace(command_engine_config(), max_batch_size=7, early_final_s=0.4,
                   second_pass_yield_s=None)
    config = engine_config_from_args(parser.parse_args(["--lm", "none"]), base=base)
    assert config == replace(base, lm="none")
    assert engine_config_from_args(parser.parse_args([])) == replace(
        command_engine_config(), decoder=replace(command_engine_config().decoder, beam_size=16,
                                                 top_k=16))
    assert command_engine_config().second_pass == "whisper"
    assert command_engine_config().num_left_chunks == 8


def test_transcribe_passes_hotwords_and_a_prompt_and_refuses_bad_ones(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from oasr.decoding.context import HotwordError, parse_hotwords
    from oasr.engine import offline

    seen: list[dict[str, object]] = []

    def fake(config, files, progress, hotwords=(), prompt=""):
        parse_hotwords(hotwords)  # as transcribe_files does, before any file
        seen.append({"hotwords": hotwords, "prompt": prompt})
        return []

    monkeypatch.setattr(offline, "transcribe_files", fake)
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"")
    assert main(["transcribe", str(audio), "--no-progress", "--hotwords", " Brenvik, ,Taloria ",
                 "--prompt", "Names."]) == 0
    assert seen == [{"hotwords": ["Brenvik", "Taloria"], "prompt": "Names."}]
    assert main(["transcribe", str(audio), "--no-progress",
                 "--hotwords", ",".join(f"t{i}" for i in range(101))]) == 2
    assert "at most 100" in capsys.readouterr().err
    assert isinstance(HotwordError("x"), ValueError)
