"""``oasr-server``'s command line (`backend.cli`): every flag reaches its config field."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.cli import FIELD_FLAGS, build_parser, server_config_from_args
from backend.config import ServerConfig
from oasr.engine.live.quiet_tail import QuietTail

README = Path(__file__).resolve().parents[2] / "README.md"


def _other_value(default: object) -> str:
    """A valid value for a field that differs from its default, as typed on the command line."""
    if isinstance(default, str):
        return "replica-b" if default != "replica-b" else "replica-c"
    assert isinstance(default, int | float)
    return str(default * 2 if default else 1)


@pytest.mark.parametrize("flag", FIELD_FLAGS, ids=lambda f: f.flag)
def test_each_field_flag_sets_its_field(flag, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OASR_API_KEYS", raising=False)
    defaults = ServerConfig()
    owner = defaults.engine if flag.engine else defaults
    default = getattr(owner, flag.field)
    value = _other_value(default)
    config = server_config_from_args(build_parser().parse_args(
        [flag.flag, value, "--lm", "none", "--second-pass", "none"]))
    got = getattr(config.engine if flag.engine else config, flag.field)
    assert got == type(default)(value) and got != default


def test_no_flags_give_the_default_server_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OASR_API_KEYS", raising=False)
    config = server_config_from_args(build_parser().parse_args(["--lm", "none"]))
    defaults = ServerConfig()
    for flag in FIELD_FLAGS:
        owner, default_owner = ((config.engine, defaults.engine) if flag.engine
                                else (config, defaults))
        assert getattr(owner, flag.field) == getattr(default_owner, flag.field), flag.flag
    assert config.max_upload_bytes == defaults.max_upload_bytes
    # a live server runs Whisper in its own process unless told otherwise
    assert config.engine.second_pass_process and defaults.engine.second_pass_process
    on_thread = server_config_from_args(build_parser().parse_args(
        ["--lm", "none", "--no-second-pass-process"]))
    assert not on_thread.engine.second_pass_process
    # ... in two processes where there are two cores (one on a thread)
    assert (config.engine.second_pass_processes == defaults.engine.second_pass_processes
            == min(2, os.cpu_count() or 1))
    assert on_thread.engine.second_pass_processes == 1
    three = server_config_from_args(build_parser().parse_args(
        ["--lm", "none", "--second-pass-processes", "3"]))
    assert three.engine.second_pass_processes == 3
    # a demo's load (endpoints between chunks, early finals): 2 streams per process
    assert config.engine.resolved_light_load_streams == 2 * min(2, os.cpu_count() or 1)
    assert on_thread.engine.resolved_light_load_streams == 2
    assert three.engine.resolved_light_load_streams == 6
    # the second pass's processes run 10 CPU priority steps below the server unless told
    assert config.engine.second_pass_nice == defaults.engine.second_pass_nice == 10
    level = server_config_from_args(build_parser().parse_args(
        ["--lm", "none", "--second-pass-nice", "0"]))
    assert level.engine.second_pass_nice == 0
    with pytest.raises(ValueError, match="second_pass_nice must be in 0..19"):
        server_config_from_args(build_parser().parse_args(
            ["--lm", "none", "--second-pass-nice", "20"]))
    with pytest.raises(ValueError, match="needs second_pass_process"):
        server_config_from_args(build_parser().parse_args(
            ["--lm", "none", "--no-second-pass-process", "--second-pass-processes", "2"]))
    # endpoints are decided on the quiet audio between chunks too, unless told otherwise
    assert config.engine.endpoint_quiet == QuietTail() == defaults.engine.endpoint_quiet
    at_chunks = server_config_from_args(build_parser().parse_args(
        ["--lm", "none", "--no-endpoint-between-chunks"]))
    assert at_chunks.engine.endpoint_quiet is None


def test_repeatable_flags_and_upload_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OASR_API_KEYS", "sk-env")
    config = server_config_from_args(build_parser().parse_args([
        "--allowed-origin", "http://a.example", "--allowed-origin", "*",
        "--api-key", "sk-one", "--allowed-host", "asr.example.com", "--max-upload-mb", "3",
        "--lm", "none"]))
    assert config.allowed_origins == ("http://a.example", "*")
    assert config.api_keys == ("sk-one", "sk-env")
    assert config.allowed_hosts == ("asr.example.com",)
    assert config.max_upload_bytes == 3 * 2**20


def test_every_flag_in_the_readme_configuration_table_is_accepted() -> None:
    table = README.read_text().split("## Configuration")[1].split("\n\n")[2]
    documented = set(re.findall(r"`(--[a-z0-9-]+)", table))
    known = {s for action in build_parser()._actions for s in action.option_strings}
    assert len(documented) > 30, "the README's Configuration table moved"
    assert documented <= known, documented - known


def test_python_dash_m_backend_is_oasr_server() -> None:
    done = subprocess.run([sys.executable, "-m", "backend", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: oasr-server")
    assert "--max-socket-audio" in done.stdout and "--lm-weight" in done.stdout


def test_endpoint_flags_choose_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint flag: the library's default rules (WeNet's silences, 20 s segments cut at a
    quiet point); ``--endpoint-pause`` / ``--max-segment`` switch to the sentence-pause rules
    with the value given, the other at its sentence-pause default."""
    from oasr.decoding import EndpointConfig
    from oasr.engine import EngineConfig

    monkeypatch.delenv("OASR_API_KEYS", raising=False)

    def endpoint(*flags: str) -> EndpointConfig:
        config = server_config_from_args(build_parser().parse_args(["--lm", "none", *flags]))
        assert config.engine.endpoint is not None
        return config.engine.endpoint

    assert endpoint() == EngineConfig().endpoint == EndpointConfig.wenet_quiet_cut()
    pause = endpoint("--endpoint-pause", "0.6")
    assert pause.rule2 is not None and pause.rule2.min_trailing_silence_s == 0.6
    assert pause.rule2.min_words == 3 and pause.rule3 == EndpointConfig().rule3
    longest = endpoint("--max-segment", "4")
    assert longest.rule2 == EndpointConfig().rule2
    assert longest.rule3 is not None and longest.rule3.min_utterance_length_s == 4.0
    assert longest.max_cut_window_s == 2.0  # at most half the segment
