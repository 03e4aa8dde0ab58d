"""Stage 1: the training text.

Source: the example sentences of WordNet 3.0 (Debian package ``wordnet-base``, files
``/usr/share/wordnet/data.{noun,verb,adj,adv}``; WordNet 3.0 licence: free use, copying and
distribution with the copyright notice kept, see recipes/README.md). Each synset gloss carries
zero or more quoted usage examples; those are real English sentences over a very broad vocabulary.
They are complemented by random spoken digit strings ("four two seven nine"), generated here.

Every sentence is normalised to the model's alphabet (lowercase a-z, apostrophe, single spaces),
kept only if it has 3-25 words and nothing a TTS engine would read differently from its spelling
(digits, acronyms, symbols, abbreviations), de-duplicated, and removed if it appears in the test
manifests under ``tests/data/audio`` (`TEST_AUDIO_ROOT`). The result is split into train / heldout-sentences /
heldout-voices sentence lists (disjoint), written as one sentence per line.
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass
from pathlib import Path

from recipes.paths import DATA_ROOT

TEST_AUDIO_ROOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "audio"
"""The test audio in the repository (the dev set and its ``manifest.tsv``): its transcripts never
enter training or LM text, and the recipes' evaluations score on its dev set."""
WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

_QUOTED = re.compile(r'"([^"]+)"')
_ALLOWED_RAW = re.compile(r"^[A-Za-z' ,;:.!?\-()]+$")
_ACRONYM = re.compile(r"\b[A-Z]{2,}\b|\b[A-Za-z]\.[A-Za-z]\.")
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|etc|vs|Mt|Gen|Col|Capt|Prof)\.", re.I)
_NON_ALPHABET = re.compile(r"[^a-z' ]+")


@dataclass(frozen=True)
class TextConfig:
    """Sizes and seed of the text stage."""

    min_words: int = 3
    max_words: int = 25
    num_heldout_sentences: int = 300
    num_heldout_voice_sentences: int = 200
    num_digit_strings: int = 600
    seed: int = 1234

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(
                f"need 1 <= min_words <= max_words, got {self.min_words} and {self.max_words}"
            )


def normalize(text: str) -> str:
    """Lowercase ``text`` and keep only a-z, apostrophes and single spaces.

    Hyphens and punctuation become word breaks; apostrophes at word edges are dropped
    (quotes), inner ones kept ("don't").
    """
    text = text.lower().replace("-", " ")
    text = _NON_ALPHABET.sub(" ", text)
    words = [w.strip("'") for w in text.split()]
    return " ".join(w for w in words if w)


def is_speakable(raw: str) -> bool:
    """True when a TTS engine reads ``raw`` as its normalised spelling (no digits, acronyms...)."""
    if not _ALLOWED_RAW.match(raw):
        return False
    return not (_ACRONYM.search(raw) or _ABBREV.search(raw))


def wordnet_examples(wordnet_dir: Path = WORDNET_DIR) -> list[str]:
    """Raw quoted usage examples from the WordNet data files, in file order."""
    examples: list[str] = []
    for name in WORDNET_FILES:
        path = wordnet_dir / name
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: apt-get install wordnet-base")
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:
                continue  # licence header
            gloss = line.split("|", 1)[1]
            examples.extend(m.strip() for m in _QUOTED.findall(gloss))
    return examples


def digit_strings(count: int, rng: random.Random) -> list[str]:
    """``count`` random spoken digit strings of 3-9 digits ("four two seven")."""
    return [
        " ".join(rng.choice(DIGIT_WORDS) for _ in range(rng.randint(3, 9))) for _ in range(count)
    ]


def forbidden_sentences(audio_root: Path) -> set[str]:
    """Normalised transcripts of every ``manifest.tsv`` under ``audio_root`` (test material)."""
    found: set[str] = set()
    for manifest in audio_root.rglob("manifest.tsv"):
        for line in manifest.read_text(encoding="utf-8").splitlines():
            if "\t" in line:
                found.add(normalize(line.split("\t", 1)[1]))
    return found


def build_sentences(cfg: TextConfig, audio_root: Path,
                    wordnet_dir: Path = WORDNET_DIR) -> list[str]:
    """All usable sentences: filtered, normalised, unique, without test transcripts; shuffled."""
    rng = random.Random(cfg.seed)
    forbidden = forbidden_sentences(audio_root)
    seen: set[str] = set()
    out: list[str] = []
    for raw in wordnet_examples(wordnet_dir):
        if not is_speakable(raw):
            continue
        text = normalize(raw)
        num_words = len(text.split())
        if not cfg.min_words <= num_words <= cfg.max_words or text in seen or text in forbidden:
            continue
        seen.add(text)
        out.append(text)
    digits = [d for d in digit_strings(cfg.num_digit_strings, rng) if d not in forbidden]
    out.extend(d for d in dict.fromkeys(digits) if d not in seen)
    rng.shuffle(out)
    return out


def split_sentences(sentences: list[str], cfg: TextConfig) -> dict[str, list[str]]:
    """Disjoint ``train`` / ``heldout_sentences`` / ``heldout_voices`` lists."""
    need = cfg.num_heldout_sentences + cfg.num_heldout_voice_sentences
    if len(sentences) <= need:
        raise ValueError(f"only {len(sentences)} sentences, heldout splits need {need}")
    a, b = cfg.num_heldout_sentences, need
    return {
        "heldout_sentences": sentences[:a],
        "heldout_voices": sentences[a:b],
        "train": sentences[b:],
    }


def write_text(out_dir: Path, cfg: TextConfig, audio_root: Path,
               wordnet_dir: Path = WORDNET_DIR) -> dict[str, int]:
    """Write ``<split>.txt`` files into ``out_dir``; returns sentences per split."""
    splits = split_sentences(build_sentences(cfg, audio_root, wordnet_dir), cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in splits.items():
        (out_dir / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {name: len(lines) for name, lines in splits.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--audio-root", type=Path, default=TEST_AUDIO_ROOT)
    args = parser.parse_args(argv)
    counts = write_text(args.data / "text", TextConfig(), args.audio_root)
    print("sentences per split:", counts)


if __name__ == "__main__":
    main()
