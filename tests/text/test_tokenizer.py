import re
import string
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oasr.text.tokenizer import (
    BpeTokenizer,
    CharTokenizer,
    load_tokenizer,
    read_units,
    write_units,
)

EN_UNITS = ["<blank>", "<unk>", "'", *string.ascii_lowercase, "\u2581", "<sos/eos>"]


def test_char_roundtrip_and_ids() -> None:
    tok = CharTokenizer.from_units(EN_UNITS)
    assert tok.vocab_size == 31
    assert tok.blank_id == 0
    ids = tok.encode("it's  a test ")
    assert ids[:4] == [EN_UNITS.index(c) for c in "it's"]
    assert ids[4] == EN_UNITS.index("\u2581")
    assert tok.decode(ids) == "it's a test"


def test_char_unknown_chars() -> None:
    tok = CharTokenizer.from_units(EN_UNITS)
    assert tok.encode("a!") == [EN_UNITS.index("a"), 1]
    with pytest.raises(KeyError, match="'!'"):
        tok.encode("a!", strict=True)


def test_char_decode_drops_specials_and_collapses_boundaries() -> None:
    tok = CharTokenizer.from_units(EN_UNITS)
    b = EN_UNITS.index("\u2581")
    a, c = EN_UNITS.index("a"), EN_UNITS.index("c")
    ids = [b, 0, a, 1, b, b, 30, c, b]
    assert tok.decode(ids) == "a c"
    with pytest.raises(ValueError, match="id 31 out of range"):
        tok.decode([31])


def test_space_token_and_cjk_units(tmp_path: Path) -> None:
    units = ["<blank>", "<unk>", "<space>", "你", "好", "a", "<sos/eos>"]
    tok = CharTokenizer.from_units(units)
    assert tok.encode("你好 a") == [3, 4, 2, 5]
    assert tok.decode([3, 4, 2, 5]) == "你好 a"


def test_units_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "units.txt"
    CharTokenizer.from_units(EN_UNITS).write_units(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "<blank> 0" and lines[-1] == "<sos/eos> 30"
    assert read_units(path) == EN_UNITS
    tok = load_tokenizer(path)
    assert isinstance(tok, CharTokenizer) and tok.units == EN_UNITS


def test_units_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "units.txt"
    path.write_text("<blank> 0\na 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="ids are not 0..1"):
        read_units(path)
    path.write_text("<blank> 0\na 0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="id 0 given to 'a'"):
        read_units(path)
    path.write_text("<blank>0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":1: expected"):
        read_units(path)
    with pytest.raises(ValueError, match="'a' appears twice"):
        CharTokenizer.from_units(["<blank>", "a", "a"])
    with pytest.raises(ValueError, match="must contain '<blank>'"):
        CharTokenizer.from_units(["a", "b"])


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("bpe")
    words = ["HELLO", "WORLD", "STREAMING", "SPEECH", "RECOGNITION", "TEST", "THE", "CAT"]
    lines = [" ".join(words[(i + j) % len(words)] for j in range(5)) for i in range(200)]
    (d / "text.txt").write_text("\n".join(lines), encoding="utf-8")
    spm.SentencePieceTrainer.Train(
        input=str(d / "text.txt"),
        model_prefix=str(d / "bpe"),
        vocab_size=40,
        model_type="bpe",
        character_coverage=1.0,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor()
    sp.Load(str(d / "bpe.model"))
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
    normal = [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    write_units(["<blank>", "<unk>", *normal, "<sos/eos>"], d / "units.txt")
    return d


def test_bpe_roundtrip(bpe_dir: Path) -> None:
    tok = load_tokenizer(bpe_dir / "units.txt", bpe_dir / "bpe.model")
    assert isinstance(tok, BpeTokenizer)
    assert tok.blank_id == 0
    ids = tok.encode("HELLO  STREAMING WORLD")
    assert all(2 <= i < tok.vocab_size - 1 for i in ids)
    assert tok.units[ids[0]].startswith("\u2581")
    assert tok.decode(ids) == "HELLO STREAMING WORLD"
    assert tok.decode([0, *ids, 0, tok.vocab_size - 1]) == "HELLO STREAMING WORLD"
    assert tok.encode("") == []


def test_bpe_unknown_piece(bpe_dir: Path) -> None:
    tok = load_tokenizer(bpe_dir / "units.txt", bpe_dir / "bpe.model")
    assert 1 in tok.encode("HELLO Z")
    with pytest.raises(KeyError):
        tok.encode("HELLO Z", strict=True)
    with pytest.raises(FileNotFoundError, match="missing.model"):
        load_tokenizer(bpe_dir / "units.txt", bpe_dir / "missing.model")


# decode through a per-unit piece table must give exactly what the per-token loop it replaced
# gave (text, and error type and message): these are that loop, as reference.
def _loop_ids(units: list[str], ids: object) -> list[str]:
    out = []
    for i in ids:  # type: ignore[attr-defined]
        i = int(i)
        if not 0 <= i < len(units):
            raise ValueError(f"token id {i} out of range for a vocabulary of {len(units)}")
        out.append(units[i])
    return out


def _special(token: str) -> bool:
    return len(token) > 2 and token.startswith("<") and token.endswith(">")


def loop_char_decode(units: list[str], ids: object) -> str:
    pieces = []
    for token in _loop_ids(units, ids):
        if token in ("\u2581", "<space>"):
            pieces.append(" ")
        elif not _special(token):
            pieces.append(token.replace("\u2581", " "))
    return re.sub(r"\s+", " ", "".join(pieces)).strip()


def loop_bpe_decode(units: list[str], ids: object) -> str:
    text = "".join(t for t in _loop_ids(units, ids) if not _special(t)).replace("\u2581", " ")
    return re.sub(r"\s+", " ", text).strip()


def outcome(decode: Callable[[object], str], ids: object) -> tuple[str, str]:
    """("ok", text) or (exception type, message)."""
    try:
        return "ok", decode(ids)
    except Exception as e:  # the comparison is of the errors themselves
        return type(e).__name__, str(e)


# Boundaries as "▁" and "<space>", units with "▁" inside, specials and near-specials ("<>",
# "<x", "x>"), an apostrophe, units that are themselves whitespace (U+3000, U+001C, U+0085).
ODD_UNITS = ["<blank>", "<unk>", "<space>", "\u2581", "a", "'", "\u2581b", "c\u2581", "<>", "<x",
             "x>", "<a>", "\u3000", "\u2581\u2581", "d", "\x1c", "\x85", "<sos/eos>"]


def tricky_ids(units: list[str]) -> list[object]:
    """Id sequences whose text is easy to get wrong, plus ids that must raise."""
    n, b = len(units), units.index("\u2581")
    unk, sp = units.index("<unk>"), units.index("<space>") if "<space>" in units else b
    letters = [i for i, u in enumerate(units) if not _special(u) and u.strip("\u2581")]
    a, c = letters[0], letters[-1]
    seqs: list[object] = [
        [], [b], [b, b, b], [sp, b, sp], [b, a, b], [b, b, a, b, b, c, b, b], [a, unk, c],
        [unk, b, unk], [0, a, 0, 0, c, n - 1], [a, b, 0, b, c], list(range(n)),
        list(range(n))[::-1], (a, b, c), iter([a, b, c]), np.array([a, b, c]),
        torch.tensor([a, b, c]), [float(a), True, np.int64(c)],
        [-1], [a, -1], [n], [a, n, -1], iter([a, n]), [n + 5, "x"], ["x", n], [None], [a, 2.5], [1e30],
    ]
    return seqs


def twice(ids: object) -> tuple[object, object]:
    """Two uses of ``ids``: an iterator is replayed as two iterators over the same ids."""
    if isinstance(ids, Iterator):
        items = list(ids)
        return iter(items), iter(items)
    return ids, ids


@pytest.mark.parametrize("units", [EN_UNITS, ODD_UNITS])
def test_char_decode_matches_the_per_token_loop(units: list[str]) -> None:
    tok = CharTokenizer.from_units(units)
    for ids in tricky_ids(units):
        mine, ref = twice(ids)
        assert outcome(tok.decode, mine) == outcome(partial(loop_char_decode, units), ref), ids


def test_char_decode_of_odd_units() -> None:
    tok = CharTokenizer.from_units(ODD_UNITS)
    assert tok.decode(range(6, 15)) == "bc <><xx> d"
    assert tok.decode([3, 5, 4, 1, 2, 5, 2]) == "'a '"
    assert CharTokenizer.from_units(EN_UNITS).decode([29, 2, 9, 2, 29, 29]) == "'g'"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-2, len(ODD_UNITS) + 1), max_size=40))
def test_char_decode_matches_the_loop_on_random_ids(ids: list[int]) -> None:
    tok = CharTokenizer.from_units(ODD_UNITS)
    assert outcome(tok.decode, ids) == outcome(partial(loop_char_decode, ODD_UNITS), ids)


def test_bpe_decode_matches_the_per_token_loop(bpe_dir: Path) -> None:
    tok = load_tokenizer(bpe_dir / "units.txt", bpe_dir / "bpe.model")
    assert "\u2581" in tok.units
    units = [*tok.units[:-1], "<space>", "<x", tok.units[-1]]  # units a BPE may not have
    tok = BpeTokenizer(units, bpe_dir / "bpe.model")
    for ids in [*tricky_ids(units), tok.encode("HELLO THE  CAT "), [1, 1, *tok.encode("CAT")]]:
        mine, ref = twice(ids)
        assert outcome(tok.decode, mine) == outcome(partial(loop_bpe_decode, units), ref), ids
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(-1, len(units) + 1, (int(torch.randint(0, 30, (1,), generator=g)),),
                            generator=g).tolist()
        assert outcome(tok.decode, ids) == outcome(partial(loop_bpe_decode, units), ids), ids
