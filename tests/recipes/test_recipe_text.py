"""Text stage: normalisation, filtering of unspeakable sentences, test-set exclusion, splits."""

from pathlib import Path

import pytest

from recipes.text import TextConfig, build_sentences, is_speakable, normalize, split_sentences

WORDNET_LINES = [
    "  1 This software and database is being provided to you, the LICENSEE, by",
    '00001740 29 v 04 breathe 0 | draw air into, and expel out of, the lungs; "I can breathe better'
    ' when the air is clean"; "The patient is respiring"',
    '00002000 29 n 01 word 0 | a gloss; "the weather is nice today so we will walk to the park"; '
    '"Mr. Smith came home late"; "DNA is the substance of our genes"; "it cost 20 dollars"',
    '00003000 29 a 01 well 0 | another; "she didn\'t see the well-known actor at the station"; '
    '"two words"',
]


@pytest.fixture
def wordnet_dir(tmp_path: Path) -> Path:
    d = tmp_path / "wordnet"
    d.mkdir()
    for name in ("data.noun", "data.verb", "data.adj", "data.adv"):
        (d / name).write_text("")
    (d / "data.verb").write_text("\n".join(WORDNET_LINES) + "\n", encoding="latin-1")
    return d


@pytest.fixture
def audio_root(tmp_path: Path) -> Path:
    d = tmp_path / "audio" / "devset"
    d.mkdir(parents=True)
    (d / "manifest.tsv").write_text("tts_00.wav\tthe weather is nice today so we will walk to the park\n")
    return tmp_path / "audio"


def test_normalize_keeps_alphabet_and_inner_apostrophes() -> None:
    assert normalize("She didn't see the WELL-known 'actor'!") == "she didn't see the well known actor"
    assert normalize("  Hello,   world;  ") == "hello world"


@pytest.mark.parametrize(
    "raw, ok",
    [("I can breathe better", True), ("it cost 20 dollars", False), ("DNA is here", False),
     ("Mr. Smith came", False), ("a & b", False), ("the U.S. army", False)],
)
def test_is_speakable(raw: str, ok: bool) -> None:
    assert is_speakable(raw) is ok


def test_build_sentences_filters_and_excludes_test_transcripts(wordnet_dir: Path,
                                                              audio_root: Path) -> None:
    cfg = TextConfig(num_digit_strings=5, num_heldout_sentences=1, num_heldout_voice_sentences=1)
    sentences = build_sentences(cfg, audio_root, wordnet_dir)
    words = [s for s in sentences if not set(s.split()) <= set(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])]
    assert sorted(words) == sorted([
        "i can breathe better when the air is clean",
        "the patient is respiring",
        "she didn't see the well known actor at the station",
    ])  # test transcript, abbreviation, acronym, digits and the 2-word example are gone
    assert len(sentences) == 3 + 5
    assert all(3 <= len(s.split()) <= 25 for s in sentences)


def test_splits_are_disjoint_and_complete() -> None:
    cfg = TextConfig(num_heldout_sentences=3, num_heldout_voice_sentences=2)
    sentences = [f"sentence number {i} here" for i in range(20)]
    splits = split_sentences(sentences, cfg)
    assert [len(splits[k]) for k in ("heldout_sentences", "heldout_voices", "train")] == [3, 2, 15]
    seen = [s for part in splits.values() for s in part]
    assert sorted(seen) == sorted(sentences)
    with pytest.raises(ValueError, match="only 5 sentences"):
        split_sentences(sentences[:5], cfg)
