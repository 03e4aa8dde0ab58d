"""Token ids <-> text for CTC models: character units and sentencepiece BPE.

Both tokenizers read the WeNet ``units.txt`` format: one ``<token> <id>`` per line, ids
contiguous from 0, ``<blank> 0`` and ``<unk> 1`` first and ``<sos/eos>`` last. The word boundary
is "▁" (U+2581); some character models also carry a literal ``<space>`` token. ``decode`` always
returns clean text: boundaries become single spaces, the result is stripped and special tokens
(anything spelled ``<...>``: blank, unk, sos/eos, space markers) never appear in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

WORD_BOUNDARY = "\u2581"
BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"
SPACE = "<space>"

def read_units(units_path: str | Path) -> list[str]:
    """Read a WeNet ``units.txt`` into a list where ``units[i]`` is the token with id ``i``.

    Raises:
        ValueError: a malformed line, a duplicate id, or ids that are not 0..N-1.
    """
    by_id: dict[int, str] = {}
    lines = Path(units_path).read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise ValueError(f"{units_path}:{lineno}: expected '<token> <id>', got {line!r}")
        token, idx = parts[0], int(parts[1])
        if idx in by_id:
            raise ValueError(
                f"{units_path}:{lineno}: id {idx} given to {token!r} and {by_id[idx]!r}"
            )
        by_id[idx] = token
    expected = set(range(len(by_id)))
    if set(by_id) != expected:
        missing = sorted(expected - set(by_id))[:5]
        raise ValueError(
            f"{units_path}: {len(by_id)} units but ids are not 0..{len(by_id) - 1} "
            f"(missing e.g. {missing}, max id {max(by_id, default=-1)})"
        )
    return [by_id[i] for i in range(len(by_id))]


def write_units(units: Sequence[str], units_path: str | Path) -> None:
    """Write ``units`` as WeNet ``units.txt`` (``<token> <id>`` per line, id = list index)."""
    text = "".join(f"{token} {idx}\n" for idx, token in enumerate(units))
    Path(units_path).write_text(text, encoding="utf-8")


def _is_special(token: str) -> bool:
    return len(token) > 2 and token.startswith("<") and token.endswith(">")


def _piece_table(units: Sequence[str], spaces: tuple[str, ...]) -> list[str]:
    """Each unit's text in a decoded string (``table[i]`` for id ``i``): a space for the units
    in ``spaces``, nothing for other special tokens, else the unit with every "▁" a space."""
    return [
        " " if token in spaces else "" if _is_special(token) else token.replace(WORD_BOUNDARY, " ")
        for token in units
    ]


def clean_text(text: str) -> str:
    """Runs of whitespace -> one space, stripped: `decode`'s last step (``str.split`` and the ``\\s`` of a str
    regex both split at exactly the characters for which ``str.isspace`` holds)."""
    return " ".join(text.split())


class _UnitTable:
    """The id <-> token mapping shared by both tokenizers.

    Invariant: ``units`` holds distinct tokens, ``units[blank_id] == "<blank>"``.
    """

    def __init__(self, units: Sequence[str]) -> None:
        units = list(units)
        if len(units) < 2:
            raise ValueError(
                f"a tokenizer needs at least 2 units (<blank> and one more), got {len(units)}"
            )
        index: dict[str, int] = {}
        for idx, token in enumerate(units):
            if token in index:
                raise ValueError(f"unit {token!r} appears twice (ids {index[token]} and {idx})")
            index[token] = idx
        if BLANK not in index:
            raise ValueError(
                f"units must contain {BLANK!r} (WeNet puts it at id 0); got {units[:4]}..."
            )
        self.units: list[str] = units
        self.index = index

    @property
    def vocab_size(self) -> int:
        return len(self.units)

    @property
    def blank_id(self) -> int:
        return self.index[BLANK]

    @property
    def unk_id(self) -> int | None:
        return self.index.get(UNK)

    def join(self, ids: Iterable[int], pieces: Sequence[str]) -> str:
        """``pieces[int(i)]`` of every id ``i``, concatenated.

        With a table of `vocab_size` pieces built once (`_piece_table`), integer ids in range
        take a few C-level passes (min, max, join), not a Python loop; anything else (ids out
        of range, floats, ...) takes the loop, which converts with ``int`` and raises at the
        first id out of range.

        Raises:
            ValueError: an id outside 0..vocab_size-1.
        """
        ids = ids if isinstance(ids, list) else list(ids)
        try:
            if not ids or (min(ids) >= 0 and max(ids) < len(self.units)):
                return "".join(map(pieces.__getitem__, ids))
        except Exception:  # not all integers: the loop converts them (or raises as it did)
            pass
        return "".join([pieces[i] for i in self._checked(ids)])

    def _checked(self, ids: Iterable[int]) -> Iterator[int]:
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.units):
                raise ValueError(f"token id {i} out of range for a vocabulary of {len(self.units)}")
            yield i

    def lookup(self, token: str, strict: bool) -> int:
        idx = self.index.get(token)
        if idx is not None:
            return idx
        if strict or self.unk_id is None:
            raise KeyError(f"token {token!r} is not in the {len(self.units)}-unit vocabulary")
        return self.unk_id


class _UnitTableTokenizer:
    """What every tokenizer over a WeNet unit table shares: the table and its facts, and
    decoding through a table of each unit's text (``_pieces``, built once by the subclass)."""

    _table: _UnitTable
    _pieces: list[str]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> clean text (single spaces, stripped, no special tokens).

        Raises:
            ValueError: an id outside 0..vocab_size-1.
        """
        return clean_text(self.raw_text(ids))

    def raw_text(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` before `clean_text`: ``decode(ids) == clean_text(raw_text(ids))``
        and ``raw_text(a + b) == raw_text(a) + raw_text(b)``, so the text of a growing
        hypothesis can be extended instead of rebuilt.

        Raises:
            ValueError: an id outside 0..vocab_size-1.
        """
        return self._table.join(ids, self._pieces)

    def write_units(self, units_path: str | Path) -> None:
        """Write this vocabulary as ``units.txt``."""
        write_units(self.units, units_path)

    @property
    def units(self) -> list[str]:
        return list(self._table.units)

    @property
    def vocab_size(self) -> int:
        return self._table.vocab_size

    @property
    def blank_id(self) -> int:
        return self._table.blank_id


class CharTokenizer(_UnitTableTokenizer):
    """Character units: each character of the text is one token.

    Spaces in the text become the word-boundary unit ("▁" if the units have it, else
    ``<space>``); characters missing from the units become ``<unk>`` (or raise with
    ``strict=True``). ``decode`` joins the tokens, maps boundaries to spaces and drops special
    tokens, so ``decode(encode(t)) == " ".join(t.split())`` for any text whose characters are
    all units.
    """

    def __init__(self, units: Sequence[str]) -> None:
        self._table = _UnitTable(units)
        index = self._table.index
        self._boundary = (
            WORD_BOUNDARY if WORD_BOUNDARY in index else (SPACE if SPACE in index else None)
        )
        self._pieces = _piece_table(self._table.units, (WORD_BOUNDARY, SPACE))

    @classmethod
    def from_units(cls, units: Sequence[str]) -> CharTokenizer:
        """Build from a unit list (``units[i]`` has id ``i``), e.g. the training recipe's
        ``["<blank>", "<unk>", "'", "a", ..., "z", "▁", "<sos/eos>"]``."""
        return cls(units)

    @classmethod
    def from_file(cls, units_path: str | Path) -> CharTokenizer:
        """Build from a WeNet ``units.txt``."""
        return cls(read_units(units_path))

    def encode(self, text: str, strict: bool = False) -> list[int]:
        """Text -> token ids. Runs of whitespace are one boundary; leading/trailing dropped.

        Raises:
            KeyError: ``strict`` and a character is not a unit (or no ``<unk>`` unit exists).
        """
        words = text.split()
        ids: list[int] = []
        for w, word in enumerate(words):
            if w > 0:
                if self._boundary is None:
                    raise KeyError("text has spaces but the units have neither '▁' nor '<space>'")
                ids.append(self._table.index[self._boundary])
            ids.extend(self._table.lookup(ch, strict) for ch in word)
        return ids


class BpeTokenizer(_UnitTableTokenizer):
    """Sentencepiece BPE units (WeNet English models): the units.txt ids, sentencepiece's pieces.

    The model's output ids are the units.txt ids, which differ from the sentencepiece model's
    own ids (units.txt adds ``<blank>`` etc.), so pieces are mapped through the unit table.
    """

    def __init__(self, units: Sequence[str], bpe_model: str | Path) -> None:
        import sentencepiece as spm

        self._table = _UnitTable(units)
        self._sp = spm.SentencePieceProcessor()
        if not Path(bpe_model).is_file():
            raise FileNotFoundError(f"sentencepiece model {bpe_model} does not exist")
        self._sp.Load(str(bpe_model))
        self._pieces = _piece_table(self._table.units, ())

    @classmethod
    def from_file(cls, units_path: str | Path, bpe_model: str | Path) -> BpeTokenizer:
        return cls(read_units(units_path), bpe_model)

    def encode(self, text: str, strict: bool = False) -> list[int]:
        """Text -> unit ids through sentencepiece pieces (unknown pieces -> ``<unk>``).

        Raises:
            KeyError: ``strict`` and a piece is not a unit.
        """
        text = " ".join(text.split())
        pieces = self._sp.EncodeAsPieces(text) if text else []
        return [self._table.lookup(p, strict) for p in pieces]


Tokenizer = CharTokenizer | BpeTokenizer


def load_tokenizer(units_path: str | Path, bpe_model: str | Path | None = None) -> Tokenizer:
    """Load the tokenizer of a model directory.

    Args:
        units_path: WeNet ``units.txt``.
        bpe_model: sentencepiece ``.model`` for BPE models; None for character models.
    """
    if bpe_model is None:
        return CharTokenizer.from_file(units_path)
    return BpeTokenizer.from_file(units_path, bpe_model)
