"""The engine's char LM selection: a model dir's LM, --lm none, an explicit dir, the CLI flags."""

from __future__ import annotations

import argparse
import shutil

import pytest

from oasr.cli import add_engine_arguments, engine_config_from_args
from oasr.decoding import GpuDecoderConfig
from oasr.engine.config import EngineConfig
from oasr.engine.streams import StreamResources
from oasr.lm import LmBuildConfig, WordLm, WordLmHeader, build_char_lm, encode_sentences
from oasr.models.checkpoint import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A copy of the bundled model with a tiny char LM over its units."""
    directory = tmp_path_factory.mktemp("model")
    for item in DEFAULT_MODEL_DIR.iterdir():
        if item.is_file():
            shutil.copy(item, directory / item.name)
    units = (directory / "units.txt").read_text().split("\n")
    units = [line.split()[0] for line in units if line.strip()]
    lm = build_char_lm(encode_sentences(["the cat sat", "a dog"], units), units,
                       LmBuildConfig(order=3))
    lm.save(directory)
    return directory


def build(model_dir, beam: int, lm: str = "auto") -> StreamResources:
    config = EngineConfig(model=str(model_dir), device="cpu", max_batch_size=2, max_num_blocks=8,
                          decoder=GpuDecoderConfig(beam_size=beam), lm=lm, endpoint=None)
    return StreamResources.build(config)


def test_model_dir_lm_is_used_with_beam_search(model_dir) -> None:
    assert build(model_dir, 4).ctc.decoder.has_lm
    assert not build(model_dir, 4, lm="none").ctc.decoder.has_lm
    assert not build(model_dir, 1).ctc.decoder.has_lm  # greedy: auto means no LM


def test_model_dir_word_lm_is_loaded_beside_the_char_lm(model_dir, tmp_path) -> None:
    assert not build(model_dir, 4).ctc.decoder.has_word_lm
    with_words = tmp_path / "with_words"
    shutil.copytree(model_dir, with_words)
    units = tuple(build(model_dir, 4).family.tokenizer.units)
    WordLm(WordLmHeader.for_units(units), ["the", "cat"], [-0.5, -1.0]).save(with_words)
    decoder = build(with_words, 4).ctc.decoder
    assert decoder.has_lm and decoder.has_word_lm


def test_explicit_lm_dir(model_dir, tmp_path) -> None:
    assert build(DEFAULT_MODEL_DIR, 4, lm=str(model_dir)).ctc.decoder.has_lm
    with pytest.raises(FileNotFoundError, match="no char_lm.safetensors"):
        build(model_dir, 4, lm=str(tmp_path))
    with pytest.raises(ValueError, match="needs beam search"):
        EngineConfig(lm=str(model_dir))


def test_cli_flags_reach_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--beam-size", "8", "--lm", "none", "--lm-weight", "0.9",
                              "--lm-unit-bonus", "1.5", "--lm-word-bonus", "0.5"])
    config = engine_config_from_args(args)
    assert config.lm == "none"
    assert (config.decoder.beam_size, config.decoder.lm_weight, config.decoder.lm_unit_bonus,
            config.decoder.lm_word_bonus) == (8, 0.9, 1.5, 0.5)


def test_default_beam_is_8_with_an_lm_else_greedy(model_dir, tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)

    def beam(*argv: str) -> int:
        return engine_config_from_args(parser.parse_args(list(argv))).decoder.beam_size

    assert beam("--model", str(model_dir)) == 8
    assert beam("--model", str(model_dir), "--lm", "none") == 1
    assert beam("--model", str(tmp_path)) == 1  # no LM files there
    assert beam("--model", str(tmp_path), "--lm", str(model_dir)) == 8
    assert beam("--model", str(model_dir), "--beam-size", "4") == 4
