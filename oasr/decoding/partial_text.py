"""`PartialTexts`: each stream's partial text, extended while its best hypothesis only grows."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from oasr.decoding.state import DecoderState
from oasr.text.tokenizer import BpeTokenizer, CharTokenizer, Tokenizer, clean_text


@dataclass(frozen=True)
class _Memo:
    """The last partial of one row: its ids (a private copy) and their raw text."""

    tokenizer: CharTokenizer | BpeTokenizer
    ids: list[int]
    raw: str


class PartialTexts:
    """The text of the last partial of every (state, row), so the next partial decodes only
    the tokens it added.

    A live stream's best hypothesis mostly grows by a few tokens per step, while decoding it
    whole costs time linear in the transcript, every step. A memo is checked against the exact
    ids, so a hypothesis that is not an extension of the last one (another beam won, a reset,
    a new tokenizer) is decoded whole: `text` always equals ``tokenizer.decode(ids)``, using
    ``raw_text(a + b) == raw_text(a) + raw_text(b)``. A memo leaves with its state.
    """

    def __init__(self) -> None:
        self._memos: dict[tuple[int, int], _Memo] = {}

    def __len__(self) -> int:
        return len(self._memos)

    def text(self, tokenizer: Tokenizer, state: DecoderState, row: int, ids: list[int]) -> str:
        """``tokenizer.decode(ids)``, ``ids`` being the current best hypothesis of ``row`` of
        ``state``."""
        if not isinstance(tokenizer, CharTokenizer | BpeTokenizer):  # duck-typed: no raw_text
            return tokenizer.decode(ids)
        key = (id(state), row)
        memo = self._memos.get(key)
        if memo is None:  # first partial of this row: the memo goes when the state does
            weakref.finalize(state, self._memos.pop, key, None)
        done = len(memo.ids) if memo is not None else 0
        if memo is not None and memo.tokenizer is tokenizer and ids[:done] == memo.ids:
            raw = memo.raw + tokenizer.raw_text(ids[done:])
        else:
            raw = tokenizer.raw_text(ids)
        self._memos[key] = _Memo(tokenizer, list(ids), raw)
        return clean_text(raw)
