"""Whisper's byte-level BPE tokenizer, read from a checkpoint's ``tokenizer.json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

EOT = "<|endoftext|>"
SOT = "<|startoftranscript|>"
NO_TIMESTAMPS = "<|notimestamps|>"


class WhisperTokenizer:
    """Text <-> token ids. Ids at or above ``eot`` are special (end of transcript, start
    prompt, task and timestamp tokens) and never appear in decoded text.

    Args:
        path: the ``tokenizer.json`` file, or the checkpoint directory holding it.
    Raises:
        FileNotFoundError: no such file.
        KeyError: the file lacks one of Whisper's special tokens.
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no Whisper tokenizer at {path}")
        try:  # imported here so oasr.models.whisper imports without the optional package
            from tokenizers import Tokenizer
        except ImportError as err:
            raise ImportError(
                "the Whisper tokenizer needs the `tokenizers` package: pip install tokenizers"
            ) from err
        self._tokenizer = Tokenizer.from_file(str(path))
        self.path = path
        self.vocab_size = self._tokenizer.get_vocab_size()
        self.eot = self.special_id(EOT)

    def special_id(self, token: str) -> int:
        """The id of a special token such as ``<|startoftranscript|>``."""
        found = self._tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"{self.path} has no {token} token ({self.vocab_size} tokens)")
        return int(found)

    def find_special(self, *tokens: str) -> int | None:
        """The id of the first of ``tokens`` the vocabulary has, else None."""
        for token in tokens:
            found = self._tokenizer.token_to_id(token)
            if found is not None:
                return int(found)
        return None

    def start_prompt(self, multilingual: bool) -> tuple[int, ...]:
        """The English transcription prompt without timestamps (``<|en|><|transcribe|>`` only
        for multilingual checkpoints)."""
        names = [SOT, "<|en|>", "<|transcribe|>", NO_TIMESTAMPS] if multilingual else [
            SOT, NO_TIMESTAMPS]
        return tuple(self.special_id(n) for n in names)

    def encode(self, text: str) -> list[int]:
        """Text -> text token ids (no prompt, no end token)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        """Token ids -> text, special tokens dropped, surrounding spaces stripped."""
        return self._tokenizer.decode([t for t in tokens if 0 <= t < self.eot]).strip()

    def token_text(self, token: int) -> str | None:
        """The vocabulary entry of one id (None for ids the file does not name)."""
        return self._tokenizer.id_to_token(token)

    def word_ends(self, tokens: Sequence[int]) -> list[int]:
        """For each whitespace-separated word of ``decode(tokens)``, the number of leading
        tokens that holds it whole (a word begins at a token whose text begins with a space;
        byte-level BPE writes that space as "\u0120")."""
        ends: list[int] = []
        text_tokens = 0
        for i, token in enumerate(tokens):
            if not 0 <= token < self.eot:
                continue
            piece = self.token_text(token) or ""
            if text_tokens and piece.startswith("\u0120") and piece.strip("\u0120"):
                ends.append(i)
            text_tokens += 1
        if text_tokens:
            ends.append(len(tokens))
        return ends

