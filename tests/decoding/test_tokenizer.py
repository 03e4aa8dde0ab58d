import string
from pathlib import Path

import pytest

from oasr.decoding.tokenizer import (
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
