"""Build a `CharNgramLm` from text with a model's units."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oasr.lm.model import CharLmHeader, CharNgramLm, lm_from_dense
from oasr.lm.ngram import count_ngrams, smooth
from oasr.text.tokenizer import CharTokenizer


@dataclass(frozen=True)
class LmBuildConfig:
    """How to build a char LM.

    Attributes:
        order: n-gram order N >= 2.
        smoothing: "kneser_ney" or "witten_bell".
        min_context_count: fewest occurrences a context of length >= 2 needs to keep its own
            distribution (lengths 0 and 1 are always kept): the size knob.
        text: provenance and licence of the build text, stored in the header.
    """

    order: int = 6
    smoothing: str = "kneser_ney"
    min_context_count: int = 2
    text: str = ""

    def __post_init__(self) -> None:
        if self.order < 2:
            raise ValueError(f"order must be >= 2, got {self.order}")
        if self.min_context_count < 1:
            raise ValueError(f"min_context_count must be >= 1, got {self.min_context_count}")

    def thresholds(self) -> tuple[int, ...]:
        return (1, 1, *([self.min_context_count] * (self.order - 2)))


def encode_sentences(texts: Iterable[str], units: Sequence[str]) -> list[list[int]]:
    """Unit ids of each non-empty line (spaces become the word boundary)."""
    tokenizer = CharTokenizer.from_units(list(units))
    return [ids for ids in (tokenizer.encode(t) for t in texts) if ids]


def build_char_lm(sentences: Sequence[Sequence[int]], units: Sequence[str],
                  config: LmBuildConfig) -> CharNgramLm:
    """Count, smooth and compile ``sentences`` (unit ids) into a `CharNgramLm`.

    Raises:
        ValueError: the units have no ``<blank>`` or ``<sos/eos>``.
    """
    units = tuple(units)
    for name in ("<blank>", "<sos/eos>"):
        if name not in units:
            raise ValueError(f"units must contain {name!r} (got {len(units)} units)")
    blank_id, end_id = units.index("<blank>"), units.index("<sos/eos>")
    counts = count_ngrams(sentences, config.order, len(units), end_id)
    dense = smooth(counts, config.smoothing, blank_id, config.thresholds())
    header = CharLmHeader(order=config.order, units=units, blank_id=blank_id, end_id=end_id,
                          smoothing=config.smoothing, min_context_count=config.thresholds(),
                          text=config.text)
    return lm_from_dense(header, dense.codes, dense.probs)
