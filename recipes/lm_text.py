"""Text for the LMs: sources with clear licences, and the filter that keeps test material out.

Sources (all offline, through Debian packages or PyPI):

- WordNet 3.0 example sentences (``<data>/text/train.txt``, the acoustic training text) and
  WordNet 3.0 glosses (the definitions, Debian ``wordnet-base``); WordNet 3.0 licence
  (Princeton University: free use, copying and distribution with the copyright notice kept).
- SCOWL word list (Debian ``wamerican``, ``/usr/share/dict/american-english``): permissive
  (Kevin Atkinson et al.; use, copy, modify, distribute and sell with the notice kept).
- wordfreq 3.1 (PyPI ``wordfreq``): English word frequencies; code Apache-2.0, data CC BY-SA 4.0
  (Robyn Speer et al.). The word LM's frequency column derives from it.

Test material never enters LM text: every transcript under ``tests/data/audio`` (any
``manifest.tsv``), ``<data>/text/heldout_*.txt``; no text of Jane Austen's "Sense and
Sensibility" nor the JFK inaugural address is used as a source. `ExclusionFilter` additionally
drops every sentence that shares any 6-word sequence with those transcripts or held-out files
(or equals a shorter one).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oasr.lm import WordLm, WordLmHeader
from oasr.lm.bigram import estimate_bigrams
from oasr.lm.word import unigram_from_counts
from recipes.paths import DATA_ROOT
from recipes.text import TEST_AUDIO_ROOT, normalize

TEXT_DIR = DATA_ROOT / "text"
WORDNET_DIR = Path("/usr/share/wordnet")
DICT_WORDS = Path("/usr/share/dict/american-english")
EXCLUDE_NGRAM = 6
_WORD = re.compile(r"^[a-z']+$")


@dataclass
class ExclusionFilter:
    """Drops sentences that overlap test material.

    A sentence is excluded when it shares any ``n``-word sequence with a test text, or when a
    test text shorter than ``n`` words equals it. Comparison is on normalised text (lowercase
    a-z and apostrophes, single spaces).

    Attributes:
        n: the shared-sequence length that excludes (6).
        ngrams: every n-word sequence of the test texts.
        short: the test texts shorter than n words.
    """

    n: int = EXCLUDE_NGRAM
    ngrams: set[tuple[str, ...]] = field(default_factory=set)
    short: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @classmethod
    def from_texts(cls, texts: Iterable[str], n: int = EXCLUDE_NGRAM) -> ExclusionFilter:
        """A filter against ``texts`` (raw or normalised)."""
        excluder = cls(n=n)
        for text in texts:
            words = normalize(text).split()
            if 0 < len(words) < n:
                excluder.short.add(" ".join(words))
            excluder.ngrams.update(_ngrams(words, n))
        return excluder

    def allows(self, sentence: str) -> bool:
        """Whether ``sentence`` shares nothing with the test texts."""
        words = normalize(sentence).split()
        if " ".join(words) in self.short:
            return False
        return not any(gram in self.ngrams for gram in _ngrams(words, self.n))

    def filter(self, sentences: Sequence[str]) -> tuple[list[str], int]:
        """The allowed sentences (in order) and how many were dropped."""
        kept = [s for s in sentences if self.allows(s)]
        return kept, len(sentences) - len(kept)


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def forbidden_texts(audio_root: Path = TEST_AUDIO_ROOT, text_dir: Path = TEXT_DIR) -> list[str]:
    """Every test transcript: the manifests under ``audio_root`` and the held-out files."""
    texts = []
    for manifest in sorted(audio_root.rglob("manifest.tsv")):
        for line in manifest.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 2 and parts[1].strip():
                texts.append(parts[1])
    for path in sorted(text_dir.glob("heldout_*.txt")):
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return texts


def wordnet_glosses(wordnet_dir: Path = WORDNET_DIR, min_words: int = 3) -> list[str]:
    """The definitions of WordNet's synsets (the gloss text outside its quoted examples, split
    at semicolons), normalised; those with digits or fewer than ``min_words`` words dropped."""
    out: list[str] = []
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (wordnet_dir / f"data.{pos}").read_text(encoding="latin-1").splitlines():
            if line.startswith(" ") or " | " not in line:
                continue
            gloss = re.sub(r'"[^"]*"', " ", line.split(" | ", 1)[1])
            for part in gloss.split(";"):
                if re.search(r"[0-9]", part):
                    continue
                text = normalize(re.sub(r"\([^)]*\)", " ", part))
                if len(text.split()) >= min_words:
                    out.append(text)
    return out


def dictionary_words(path: Path = DICT_WORDS) -> list[str]:
    """The lowercase entries of a /usr/share/dict word list (a-z and apostrophes only)."""
    words = (w.strip() for w in path.read_text(encoding="utf-8").splitlines())
    return sorted({w for w in words if _WORD.match(w)})


@dataclass(frozen=True)
class WordLmConfig:
    """How the word LM's lexicon and unigram are made.

    Attributes:
        top_n: how many of wordfreq's most frequent English words join the lexicon.
        corpus_share: the unigram is ``corpus_share`` x the LM text's relative word frequency
            + the rest x wordfreq's (renormalised over the lexicon), + ``floor``.
        floor: probability added to every lexicon word (dictionary-only words get just this).
        with_dictionary: add the SCOWL word list (``/usr/share/dict/american-english``).
        bigram_min_count: keep word pairs of the LM text seen this often (0: no bigrams).
    """

    top_n: int = 50_000
    corpus_share: float = 0.8
    floor: float = 1e-8
    with_dictionary: bool = False
    bigram_min_count: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.corpus_share <= 1.0:
            raise ValueError(f"corpus_share must be in [0, 1], got {self.corpus_share}")
        if self.top_n < 0 or self.floor <= 0 or self.bigram_min_count < 0:
            raise ValueError(f"need top_n >= 0, floor > 0, bigram_min_count >= 0; got "
                             f"{self.top_n}, {self.floor}, {self.bigram_min_count}")

    def describe(self) -> str:
        """Provenance and licences for the LM header."""
        parts = [f"word frequencies: {self.corpus_share:.2f} x the LM text (WordNet 3.0 "
                 f"licence) + {1 - self.corpus_share:.2f} x wordfreq 3.1 English, top "
                 f"{self.top_n} words (PyPI wordfreq; data CC BY-SA 4.0, code Apache-2.0)"]
        if self.with_dictionary:
            parts.append("SCOWL american-english word list (Debian wamerican; permissive, "
                         "Kevin Atkinson et al.)")
        if self.bigram_min_count:
            parts.append(f"bigrams of the LM text seen >= {self.bigram_min_count} times")
        return "; ".join(parts)


def build_word_lm(units: Sequence[str], sentences: Sequence[str],
                  config: WordLmConfig) -> WordLm:
    """The word LM of ``sentences`` (normalised LM text) and the configured word lists."""
    import wordfreq

    counts = Counter(w for s in sentences for w in s.split() if _WORD.match(w))
    frequent = {w: wordfreq.word_frequency(w, "en") for w in wordfreq.top_n_list("en", config.top_n)
                if _WORD.match(w)}
    vocab = set(counts) | set(frequent)
    if config.with_dictionary:
        vocab |= set(dictionary_words())
    corpus_total = max(1, sum(counts.values()))
    frequent_total = sum(frequent.values()) or 1.0
    share = config.corpus_share
    mixed = {w: share * counts.get(w, 0) / corpus_total
             + (1 - share) * frequent.get(w, 0.0) / frequent_total + config.floor for w in vocab}
    words, log_probs = unigram_from_counts(mixed)
    header = WordLmHeader.for_units(units, text=config.describe())
    bigrams = None
    if config.bigram_min_count:
        bigrams = estimate_bigrams([s.split() for s in sentences], words, log_probs,
                                   config.bigram_min_count)
    return WordLm(header, words, log_probs, bigrams)
