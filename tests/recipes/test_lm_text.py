"""The LM text sources and the 6-word exclusion filter against test material."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.lm_text import (
    DICT_WORDS,
    WORDNET_DIR,
    ExclusionFilter,
    dictionary_words,
    forbidden_texts,
    wordnet_glosses,
)

TEST = ["And so, my fellow Americans: ask not what your country can do for you",
        "make an effort"]


def test_a_shared_six_word_sequence_excludes() -> None:
    f = ExclusionFilter.from_texts(TEST)
    assert not f.allows("they said ask not what your country can do today")  # 6+ shared
    assert not f.allows("my fellow americans ask not what")  # exactly six, punctuation aside
    assert f.allows("ask not what your country wants")  # five shared words only
    assert f.allows("my fellow americans asked not what your country")  # one word differs
    assert not f.allows("Make an effort!")  # a short test text, matched whole
    assert f.allows("make an effort to come")  # containing a short one is allowed
    kept, dropped = f.filter(["a cat sat", "so my fellow americans ask not what", "b"])
    assert kept == ["a cat sat", "b"] and dropped == 1


def test_forbidden_texts_reads_manifests_and_heldout_files(tmp_path: Path) -> None:
    audio = tmp_path / "audio" / "set"
    audio.mkdir(parents=True)
    (audio / "manifest.tsv").write_text("a.wav\tthe weather is nice today\nb.wav\t\n")
    text = tmp_path / "text"
    text.mkdir()
    (text / "heldout_sentences.txt").write_text("one two three\n\n")
    (text / "train.txt").write_text("never read\n")
    assert forbidden_texts(tmp_path / "audio", text) == ["the weather is nice today",
                                                         "one two three"]


@pytest.mark.skipif(not (WORDNET_DIR / "data.noun").is_file(), reason="no WordNet")
def test_glosses_are_normalised_definitions() -> None:
    glosses = wordnet_glosses()
    assert len(glosses) > 100_000
    assert all(g == g.lower() and '"' not in g and len(g.split()) >= 3 for g in glosses[:1000])
    assert "an entity that has physical existence" in glosses


@pytest.mark.skipif(not DICT_WORDS.is_file(), reason="no /usr/share/dict word list (wamerican)")
def test_dictionary_words_are_lowercase_letters() -> None:
    words = dictionary_words()
    assert "cavalryman" in words and "aaron" not in words  # proper names ("Aaron") dropped
    assert all(w == w.lower() for w in words)
