"""``oasr-server``'s command line (`backend.cli`): every flag reaches its config field, takes
its default from the config's dataclass, is listed by ``--help-all`` and documented in
docs/configuration.md; ``--help`` lists the few a deployer sets."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from backend.cli import FIELD_FLAGS, all_flags, build_parser, server_config_from_args
from backend.config import ServerConfig
from oasr.engine.options import ENGINE_FLAGS, Flag, format_value

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
CONFIGURATION = REPO_ROOT / "docs" / "configuration.md"
HELP_LIMIT = 25  # flags `oasr-server --help` may list (issue #46)
# what a deployer sets: model, where it listens, who may connect, the hardware, the streams
MUST_SHOW = ("--model", "--host", "--port", "--api-key", "--allowed-host", "--allowed-origin",
             "--device", "--dtype", "--threads", "--max-batch-size", "--chunk-size",
             "--num-left-chunks", "--second-pass", "--log-level", "--help-all")


@pytest.fixture(autouse=True)
def _no_env_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OASR_API_KEYS", raising=False)


def parse(*flags: str) -> ServerConfig:
    return server_config_from_args(build_parser().parse_args(["--lm", "none", *flags]))


def help_text(option: str) -> str:
    done = subprocess.run([sys.executable, "-m", "backend", option], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def listed_flags(help_output: str) -> list[str]:
    """The flags a help text lists, one per entry (``--x, --no-x`` is one entry)."""
    return re.findall(r"^  (?:-\w, )?(--[a-z0-9-]+)", help_output, re.M)


def owner(flag: Flag, config: ServerConfig) -> object:
    """What ``flag.read`` reads: the server's config, or its engine's for an engine flag."""
    return config.engine if flag in ENGINE_FLAGS else config


def _other_value(flag: Flag, default: object) -> str:
    """A valid value for the flag that differs from its default, as typed on the command line."""
    choices = flag.kwargs.get("choices")
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, str):
        return "replica-b" if default != "replica-b" else "replica-c"
    if isinstance(default, bool):
        raise AssertionError("a switch takes no value")
    if default is None:  # a share of something when the flag says FRACTION
        return "0.5" if flag.kwargs.get("metavar") == "FRACTION" else "6"
    if isinstance(default, int):
        return str(default + 1)
    assert isinstance(default, float)
    if 0 < default < 1:
        return str(default / 2)
    return str(default * 2 if default else 0.5)


VALUED = [f for f in all_flags() if f.read is not None and f.kwargs.get("action") is None
          and f.flag not in ("--model", "--lm", "--device", "--dtype", "--second-pass")]


@pytest.mark.parametrize("flag", VALUED, ids=lambda f: f.flag)
def test_each_flag_sets_its_field(flag: Flag) -> None:
    defaults = ServerConfig()
    assert flag.read is not None
    default = flag.read(owner(flag, defaults))
    value = _other_value(flag, default)
    if flag.flag == "--second-pass-processes":  # more than one needs the process, the default
        value = "3"
    got = flag.read(owner(flag, parse(flag.flag, value)))
    kind = flag.kwargs.get("type", str)
    expected = kind(value)
    if flag.flag == "--max-upload-mb":
        expected = int(expected * 2**20) / 2**20
    assert got == expected and got != default, (got, default)


@pytest.mark.parametrize("flag", [f for f in all_flags() if f.kwargs.get("action") in
                                  ("store_true", argparse.BooleanOptionalAction)],
                         ids=lambda f: f.flag)
def test_each_switch_turns_its_field_on_and_off(flag: Flag) -> None:
    assert flag.read is not None
    default = flag.read(owner(flag, ServerConfig()))
    if default:
        assert flag.read(owner(flag, parse(flag.flag.replace("--", "--no-", 1)))) is False
    else:
        assert flag.read(owner(flag, parse(flag.flag))) is True


def test_no_flags_give_the_default_server_config() -> None:
    """One source of defaults: what ``oasr-server`` runs without flags is ``ServerConfig()``."""
    config = server_config_from_args(build_parser().parse_args([]))
    defaults = ServerConfig()
    for flag in all_flags():
        if flag.read is not None and flag.flag not in ("--beam-size", "--ctc-top-k"):  # below
            assert flag.read(owner(flag, config)) == flag.read(owner(flag, defaults)), flag.flag
    # the one default resolved from the model: a beam of 16 with the bundled model's LM,
    # each frame extending prefixes by its 16 likeliest tokens
    assert config.engine == replace(defaults.engine, decoder=replace(defaults.engine.decoder,
                                                                     beam_size=16, top_k=16))
    assert parse("--ctc-top-k", "33").engine.decoder.top_k == 33
    assert parse("--beam-size", "4").engine.decoder.top_k == 4
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        parse("--ctc-top-k", "0")
    assert config.max_upload_bytes == defaults.max_upload_bytes
    # a live server runs Whisper in its own process unless told otherwise ...
    assert config.engine.second_pass == "whisper" and config.engine.second_pass_process
    on_thread = parse("--no-second-pass-process")
    assert not on_thread.engine.second_pass_process
    # ... in two processes where there are two cores (one on a thread)
    assert config.engine.second_pass_processes == min(2, os.cpu_count() or 1)
    assert on_thread.engine.second_pass_processes == 1
    assert parse("--second-pass-processes", "3").engine.second_pass_processes == 3
    # a demo's load (endpoints between chunks, early finals): 2 streams per process
    assert config.engine.resolved_light_load_streams == 2 * min(2, os.cpu_count() or 1)
    assert on_thread.engine.resolved_light_load_streams == 2
    # finals the second pass holds before one keeps its CTC text: every decoder's rows
    processes = min(2, os.cpu_count() or 1)
    assert config.engine.resolved_second_pass_max_backlog == 16 * processes
    assert on_thread.engine.resolved_second_pass_max_backlog == 16
    assert parse("--max-decode-slots", "8").engine.resolved_second_pass_max_backlog == 8 * processes
    assert parse("--second-pass-max-backlog", "5").engine.resolved_second_pass_max_backlog == 5
    with pytest.raises(ValueError, match="second_pass_max_backlog must be >= 1"):
        parse("--second-pass-max-backlog", "0")
    # finals decoded greedy once more than 2 wait; 0: all of them
    assert config.engine.second_pass_fast_backlog == 2
    assert parse("--second-pass-fast-backlog", "0").engine.second_pass_fast_backlog == 0
    with pytest.raises(ValueError, match="second_pass_fast_backlog must be >= 0"):
        parse("--second-pass-fast-backlog", "-1")
    with pytest.raises(ValueError, match="second_pass_nice must be in 0..19"):
        parse("--second-pass-nice", "20")
    with pytest.raises(ValueError, match="needs second_pass_process"):
        parse("--no-second-pass-process", "--second-pass-processes", "2")
    # 8 chunks of history; greedy without an LM
    assert config.engine.num_left_chunks == 8 and parse().engine.decoder.beam_size == 1
    assert parse("--refine-interval", "0").engine.refine is None
    assert parse("--second-pass-yield", "off").engine.second_pass_yield_s is None
    assert parse("--quantization-option", "kv_cache=fp8_e4m3").engine.quantization == {
        "kv_cache": "fp8_e4m3"}


@pytest.mark.parametrize(("cores", "flags", "threads"), [
    (2, (), 1),  # the server's second pass in processes on two cores: the engine takes one
    (1, (), 1),
    (4, (), None),  # a larger machine: torch's default, a thread per core
    (2, ("--threads", "2"), 2),  # asked for
    (2, ("--second-pass", "none"), None),  # no decoding processes to leave a core to
    (2, ("--no-second-pass-process",), None),  # the second pass on the engine's threads
])
def test_the_engines_threads_leave_a_small_machines_cores_to_the_second_pass(
        monkeypatch: pytest.MonkeyPatch, cores: int, flags: tuple[str, ...],
        threads: int | None) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    engine = parse(*flags).engine
    assert engine.resolved_num_threads == threads
    assert engine.num_threads == (2 if "--threads" in flags else None)  # the field stays unset


def test_a_flags_default_is_its_dataclass_fields() -> None:
    """The "(default: X)" of every flag that sets one field is that field's value in
    ``ServerConfig()`` (or its engine), formatted: no default is written twice."""
    parser = build_parser()
    defaults = ServerConfig()
    shown = 0
    for action in parser._actions:
        flag = next((f for f in all_flags() if f.flag in action.option_strings), None)
        if flag is None or flag.read is None or flag.default is not None:
            continue
        text = str(getattr(action, "full_help", action.help))
        match = re.search(r"\(default: (.*)\)$", text, re.S)
        assert match, flag.flag
        assert match.group(1) == format_value(flag.read(owner(flag, defaults)), flag.none)
        shown += 1
    assert shown > 40
    assert "(default: 15)" in str(parser._option_string_actions["--idle-timeout"].help)
    assert ServerConfig().engine.idle_timeout_s == 15.0


def test_help_lists_what_a_deployer_sets_and_help_all_lists_every_flag() -> None:
    short, full = help_text("--help"), help_text("--help-all")
    shown, every = listed_flags(short), listed_flags(full)
    assert len(shown) <= HELP_LIMIT, shown
    assert set(MUST_SHOW) <= set(shown)
    assert len(shown) == len(set(shown)) and len(every) == len(set(every))
    known = {s for action in build_parser()._actions for s in action.option_strings
             if s.startswith("--") and not s.startswith("--no-")}
    assert set(every) == known and set(shown) < known
    assert len(every) >= 60
    for group in ("server:", "flow control:", "second pass (Whisper finals):",
                  "live text (partials and finals of live streams):"):
        assert f"\n{group}\n" in full
    assert "--sentence-end" not in short and "--sentence-end S" in full


def test_every_flag_is_documented_in_configuration_md() -> None:
    doc = CONFIGURATION.read_text()
    documented = set(re.findall(r"`(--[a-z0-9-]+)", doc))
    known = {s for action in build_parser()._actions for s in action.option_strings
             if s.startswith("--")}
    missing = {f.flag for f in all_flags()} - documented
    assert not missing, f"docs/configuration.md does not document {sorted(missing)}"
    stale = {f for f in documented - known
             if not f.startswith("--no-")} - {"--json", "--no-progress", "--hotwords", "--prompt"}
    assert not stale, f"docs/configuration.md documents flags oasr-server lacks: {stale}"


def test_the_readme_flags_are_accepted() -> None:
    table = README.read_text().split("## Configuration")[1].split("\n## ")[0]
    documented = set(re.findall(r"`(--[a-z0-9-]+)", table))
    known = {s for action in build_parser()._actions for s in action.option_strings}
    assert len(documented) >= 10, "the README's Configuration section moved"
    assert documented <= known, documented - known


def test_repeatable_flags_upload_size_and_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OASR_API_KEYS", "sk-env")
    config = parse("--allowed-origin", "http://a.example", "--allowed-origin", "*",
                   "--api-key", "sk-one", "--allowed-host", "asr.example.com",
                   "--max-upload-mb", "3", "--log-level", "debug")
    assert config.allowed_origins == ("http://a.example", "*")
    assert config.api_keys == ("sk-one", "sk-env")
    assert config.allowed_hosts == ("asr.example.com",)
    assert config.max_upload_bytes == 3 * 2**20
    assert config.log_level == "debug"
    assert parse().api_keys == ("sk-env",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-level", "loud"])
    with pytest.raises(ValueError, match="log_level 'loud'"):
        ServerConfig(log_level="loud")


def test_python_dash_m_backend_is_oasr_server() -> None:
    text = help_text("--help")
    assert text.startswith("usage: oasr-server")
    assert "--model" in text and "--max-socket-audio" not in text
    assert "--max-socket-audio" in help_text("--help-all")


def test_field_flags_name_real_fields() -> None:
    defaults = ServerConfig()
    for flag in FIELD_FLAGS:
        assert hasattr(defaults.engine if flag.engine else defaults, flag.field_name), flag.flag


def test_endpoint_flags_choose_the_rules() -> None:
    """No endpoint flag: the library's default rules (WeNet's silences, 20 s segments cut at a
    quiet point); ``--endpoint-pause`` / ``--max-segment`` switch to the sentence-pause rules
    with the value given, the other at its sentence-pause default."""
    from oasr.decoding import EndpointConfig
    from oasr.engine import EngineConfig

    def endpoint(*flags: str) -> EndpointConfig:
        config = parse(*flags)
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
