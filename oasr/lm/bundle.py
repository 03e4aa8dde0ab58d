"""`DecoderLm`: the language models a decoder fuses (a char n-gram, a word lexicon, or both)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from oasr.lm.model import CharLmHeader, CharNgramLm, has_char_lm, load_char_lm
from oasr.lm.word import WordLm, WordLmHeader, has_word_lm, load_word_lm


@dataclass(frozen=True)
class DecoderLm:
    """A char LM and / or a word LM over the same units, fused together into beam search.

    Attributes:
        char: the char n-gram (None: only the unit / word bonuses of the char side apply).
        word: the word lexicon LM (None: no word-level score).
    """

    char: CharNgramLm | None = None
    word: WordLm | None = None

    def __post_init__(self) -> None:
        if self.char is None and self.word is None:
            raise ValueError("a DecoderLm needs a char LM, a word LM or both")
        if self.char is not None and self.word is not None:
            self.word.check_units(self.char.header.units)

    @property
    def _header(self) -> CharLmHeader | WordLmHeader:
        """The char LM's header, else the word LM's (their units agree: `__post_init__`)."""
        source = self.char if self.char is not None else self.word
        assert source is not None
        return source.header

    @property
    def units(self) -> tuple[str, ...]:
        return self._header.units

    @property
    def blank_id(self) -> int:
        return self._header.blank_id

    @property
    def fusion_defaults(self) -> dict[str, float]:
        """The fusion weights tuned with these LMs (the word LM header's), {} when none."""
        return {} if self.word is None else dict(self.word.header.fusion)

    @property
    def num_states(self) -> int:
        """Automaton states of both LMs together (for logs)."""
        return sum(lm.num_states for lm in (self.char, self.word) if lm is not None)

    def check_units(self, units: Sequence[str]) -> None:
        """Raises ValueError unless ``units`` are the LMs' units, in the same order."""
        for lm in (self.char, self.word):
            if lm is not None:
                lm.check_units(units)

    def to(self, device: torch.device | str) -> DecoderLm:
        """The char LM's tables on ``device`` (the word LM's are built on demand there)."""
        return DecoderLm(None if self.char is None else self.char.to(device), self.word)

    def __repr__(self) -> str:
        parts = [f"char={self.char.num_states} states" if self.char is not None else "char=None",
                 f"word={len(self.word.words)} words" if self.word is not None else "word=None"]
        return f"DecoderLm({', '.join(parts)})"


def as_decoder_lm(lm: CharNgramLm | DecoderLm) -> DecoderLm:
    """``lm`` as a `DecoderLm` (a bare char LM becomes one without a word LM)."""
    return lm if isinstance(lm, DecoderLm) else DecoderLm(char=lm)


def has_decoder_lm(directory: str | Path) -> bool:
    """Whether ``directory`` holds a char LM or a word LM."""
    return has_char_lm(directory) or has_word_lm(directory)


def load_decoder_lm(directory: str | Path, device: torch.device | str = "cpu") -> DecoderLm:
    """The LMs of a model directory: its char LM and its word LM, whichever it has.

    Raises:
        FileNotFoundError: the directory has neither.
    """
    char = load_char_lm(directory, device) if has_char_lm(directory) else None
    word = load_word_lm(directory) if has_word_lm(directory) else None
    if char is None and word is None:
        raise FileNotFoundError(f"{directory} has neither a char LM (char_lm.safetensors + "
                                "char_lm.json) nor a word LM (word_lm.txt + word_lm.json)")
    return DecoderLm(char, word)
