"""Whisper's byte-level BPE tokenizer, read from a checkpoint's ``tokenizer.json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer


class WhisperTokenizer:
    """Text <-> token ids. Ids at or above ``eot`` are special (end of transcript, start
    prompt, task and timestamp tokens) and never appear in decoded text.

    Args:
        path: the ``tokenizer.json`` file, or the checkpoint directory holding it.
        eot: the end-of-transcript id (tiny.en: 50256); everything below it is text.
    """

    def __init__(self, path: str | Path, eot: int = 50256) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no Whisper tokenizer at {path}")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.eot = eot
        self.vocab_size = self._tokenizer.get_vocab_size()
        if self.vocab_size <= eot:
            raise ValueError(f"{path}: {self.vocab_size} tokens, but eot is {eot}")

    def encode(self, text: str) -> list[int]:
        """Text -> text token ids (no prompt, no end token)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        """Token ids -> text, special tokens dropped, surrounding spaces stripped."""
        return self._tokenizer.decode([t for t in tokens if 0 <= t < self.eot]).strip()

    def token_text(self, token: int) -> str | None:
        """The vocabulary entry of one id (None for ids the file does not name)."""
        return self._tokenizer.id_to_token(token)
