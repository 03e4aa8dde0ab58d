"""The engine's char LM selection: a model dir's LM, --lm none, an explicit dir, the CLI flags."""

from __future__ import annotations

import argparse
import shutil

import pytest

from oasr.decoding import GpuDecoderConfig
from oasr.engine.config import EngineConfig
from oasr.engine.options import add_engine_arguments, engine_config_from_args
from oasr.engine.runner.streams import StreamResources
from oasr.lm import LmBuildConfig, WordLm, WordLmHeader, build_char_lm, encode_sentences
from oasr.models.checkpoint import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A copy of the bundled model (without its LMs) with a tiny char LM over its units."""
    directory = tmp_path_factory.mktemp("model")
    for item in DEFAULT_MODEL_DIR.iterdir():
        if item.is_file() and not item.name.startswith(("char_lm.", "word_lm.")):
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
                              "--lm-unit-bonus", "1.5", "--lm-word-bonus", "0.5",
                              "--lm-word-weight", "0.4", "--lm-oov-penalty", "2.5"])
    config = engine_config_from_args(args)
    assert config.lm == "none"
    d = config.decoder
    assert (d.beam_size, d.lm_weight, d.lm_unit_bonus, d.lm_word_bonus, d.word_lm_weight,
            d.word_oov_penalty) == (8, 0.9, 1.5, 0.5, 0.4, 2.5)
    defaults = engine_config_from_args(parser.parse_args([])).decoder
    assert defaults.lm_weight is None and defaults.word_lm_weight is None  # the LM's tuned


def test_tuned_weights_travel_with_the_word_lm(model_dir, tmp_path) -> None:
    directory = tmp_path / "tuned"
    shutil.copytree(model_dir, directory)
    units = tuple(build(model_dir, 4).family.tokenizer.units)
    tuned = {"lm_weight": 0.5, "lm_unit_bonus": 1.5, "word_lm_weight": 0.4,
             "word_oov_penalty": 1.0}
    WordLm(WordLmHeader.for_units(units, fusion=tuned), ["a"], [0.0]).save(directory)
    config = build(directory, 4).ctc.decoder.config
    assert (config.lm_weight, config.lm_unit_bonus, config.word_lm_weight,
            config.word_oov_penalty) == (0.5, 1.5, 0.4, 1.0)
    explicit = EngineConfig(model=str(directory), device="cpu", max_batch_size=2,
                            max_num_blocks=8, endpoint=None,
                            decoder=GpuDecoderConfig(beam_size=4, lm_weight=0.9))
    config = StreamResources.build(explicit).ctc.decoder.config
    assert (config.lm_weight, config.word_lm_weight) == (0.9, 0.4)  # explicit wins
    assert build(model_dir, 4).ctc.decoder.config.lm_weight == 1.0  # char LM alone: fallback


def test_default_beam_is_16_with_an_lm_else_greedy(model_dir, tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)

    def beam(*argv: str) -> int:
        return engine_config_from_args(parser.parse_args(list(argv))).decoder.beam_size

    assert beam("--model", str(model_dir)) == 16
    assert beam("--model", str(model_dir), "--lm", "none") == 1
    assert beam("--model", str(tmp_path)) == 1  # no LM files there
    assert beam("--model", str(tmp_path), "--lm", str(model_dir)) == 16
    assert beam("--model", str(model_dir), "--beam-size", "4") == 4


def test_bundled_model_ships_char_and_word_lm() -> None:
    decoder = build(DEFAULT_MODEL_DIR, 8).ctc.decoder
    assert decoder.has_lm and decoder.has_word_lm
    assert decoder.config.word_lm_weight is not None and decoder.config.word_lm_weight > 0
