"""recipes.lm_build: lemma normalisation, building to a model dir, batched set scoring, cost."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oasr.lm import has_char_lm, has_word_lm, load_char_lm, load_decoder_lm
from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.checkpoint import DEFAULT_MODEL_DIR
from recipes.lm_build import (
    FusionSettings,
    build,
    build_words,
    decode_set,
    measure_cost,
    package,
    wordnet_lemmas,
)
from recipes.lm_text import WordLmConfig

UNITS = list(BUNDLED_UNITS)


@pytest.mark.skipif(not Path("/usr/share/wordnet/index.noun").is_file(), reason="no WordNet")
def test_wordnet_lemmas_are_normalised() -> None:
    lemmas = wordnet_lemmas()
    assert len(lemmas) > 50_000
    assert "dog" in lemmas and "hot dog" in lemmas  # underscores become spaces
    assert all(set(lemma) <= set("abcdefghijklmnopqrstuvwxyz' ") for lemma in lemmas)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("lm")
    text = directory / "text.txt"
    text.write_text("the cat sat\na cat ran\n\nthe black cat\nmy cat\n")
    build(order=4, min_context_count=1, smoothing="kneser_ney", with_lemmas=False,
          out=directory, text=text)
    return directory


def test_build_writes_a_loadable_lm(lm_dir: Path) -> None:
    assert has_char_lm(lm_dir)
    lm = load_char_lm(lm_dir)
    assert lm.header.order == 4 and lm.header.units == tuple(UNITS)
    assert lm.header.text.startswith("text.txt: 4 WordNet example sentences")
    assert lm.score_sequence([UNITS.index(c) for c in "cat"]) > \
        lm.score_sequence([UNITS.index(c) for c in "kat"])


def spelled(first: dict[str, float]) -> torch.Tensor:
    """(T, V) log-probs of "?at" where the first frame's units are ``first``."""
    probs = torch.full((6, len(UNITS)), 1e-4)
    for t, frame in enumerate([first, {}, {"a": 0.9}, {}, {"t": 0.9}, {}]):
        for unit, p in frame.items():
            probs[t, UNITS.index(unit)] = p
        probs[t, 0] = max(1e-4, 1.0 - sum(frame.values()))
    return (probs / probs.sum(dim=1, keepdim=True)).log()


def test_decode_set_scores_greedy_beam_and_lm(lm_dir: Path) -> None:
    rows = [("u1", spelled({"k": 0.55, "c": 0.4}), "cat"), ("u2", spelled({"c": 0.9}), "cat")]
    lm = load_char_lm(lm_dir)
    assert decode_set(rows, 1) == (50.0, pytest.approx(100 / 6))
    assert decode_set(rows, 4)[0] == 50.0
    assert decode_set(rows, 4, lm, lm_weight=0.5) == (0.0, 0.0)


def test_measure_cost_times_every_setup(lm_dir: Path) -> None:
    g = torch.Generator().manual_seed(0)
    rows = [(f"u{i}", torch.randn(12, len(UNITS), generator=g).log_softmax(-1), "x")
            for i in range(3)]
    costs = measure_cost(rows, load_char_lm(lm_dir), num_streams=3, chunk=4, num_steps=3,
                         rounds=1, beams=(4, 8))
    assert set(costs) == {"greedy", "beam4", "beam8", "beam4+lm", "beam8+lm"}
    assert all(ms > 0 for ms in costs.values())


def test_build_words_then_package_a_model_dir(lm_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("wordfreq")
    build_words(WordLmConfig(top_n=200, bigram_min_count=1), lm_dir, text=lm_dir / "text.txt")
    assert has_word_lm(lm_dir)
    out = package(lm_dir, tmp_path / "model", DEFAULT_MODEL_DIR)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    both = load_decoder_lm(out)
    assert both.char is not None and both.word is not None
    assert "cat" in both.word.words and "the" in both.word.words  # LM text + wordfreq
    assert "wordfreq" in both.word.header.text and "6-word" in both.word.header.text
    assert both.word.bigrams is not None and len(both.word.bigrams.prev) > 0


def test_decode_set_with_word_settings(lm_dir: Path) -> None:
    pytest.importorskip("wordfreq")
    build_words(WordLmConfig(top_n=200), lm_dir, text=lm_dir / "text.txt")
    rows = [("u1", spelled({"k": 0.55, "c": 0.4}), "cat")]
    words_only = FusionSettings(lm_weight=0.0, unit_bonus=0.0, word_weight=0.0, oov_penalty=3.0)
    assert decode_set(rows, 4, load_decoder_lm(lm_dir), settings=words_only)[0] == 0.0
    assert decode_set(rows, 4, load_decoder_lm(lm_dir),
                      settings=FusionSettings(0.0, 0.0))[0] == 100.0


def test_command_line_builds_from_the_given_text(tmp_path: Path) -> None:
    from recipes.lm_build import main

    text = tmp_path / "sentences.txt"
    text.write_text("zebra quilt\nzebra quilt jumps\n")
    main(["build", "--order", "3", "--min-context-count", "1", "--text", str(text),
          "--out", str(tmp_path / "lm")])
    lm = load_char_lm(tmp_path / "lm")
    assert lm.header.text.startswith("sentences.txt: 2 WordNet example sentences")
    assert lm.score_sequence([UNITS.index(c) for c in "zeb"]) > \
        lm.score_sequence([UNITS.index(c) for c in "bez"])
