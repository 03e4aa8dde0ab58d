"""PartialTexts: memoised partial texts equal a whole decode whatever the ids do, decode only
the added tokens while a hypothesis grows, and leave with their state; the decoder's partials
through it equal a whole decode at every step."""

from __future__ import annotations

import gc
from collections.abc import Iterable

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oasr.decoding import CharTokenizer, GpuDecoderConfig, GpuStreamingDecoder
from oasr.decoding.partial_text import PartialTexts
from oasr.decoding.state import new_state

UNITS = ["<blank>", "<unk>", "'", "a", "b", "c", "\u2581", "<space>", "<sos/eos>"]
V = len(UNITS)


class RecordingTokenizer(CharTokenizer):
    """A CharTokenizer that records how many ids each `raw_text` call decoded."""

    def __init__(self, units: list[str]) -> None:
        super().__init__(units)
        self.decoded: list[int] = []

    def raw_text(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        self.decoded.append(len(ids))
        return super().raw_text(ids)


def state():
    return new_state(1, 2, 8, 0, torch.device("cpu"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, V - 1), max_size=6)),
                max_size=12))
def test_text_equals_a_whole_decode_whatever_the_ids_do(moves: list[tuple[int, list[int]]]) -> None:
    """Each move grows the ids (0), cuts them and grows them again (1: another beam won) or
    starts over (2: a reset); specials and boundaries at any place."""
    tok = CharTokenizer(UNITS)
    texts, s, ids = PartialTexts(), state(), []
    for kind, added in moves:
        ids = ids + added if kind == 0 else ids[: len(ids) // 2] + added if kind == 1 else added
        assert texts.text(tok, s, 0, ids) == tok.decode(ids), ids


def test_a_growing_hypothesis_decodes_only_the_added_tokens() -> None:
    tok, texts, s = RecordingTokenizer(UNITS), PartialTexts(), state()
    b = UNITS.index("\u2581")
    assert texts.text(tok, s, 0, [3, 4, b]) == "ab"
    assert texts.text(tok, s, 0, [3, 4, b, b, 5]) == "ab c"
    assert texts.text(tok, s, 0, [3, 4, b, b, 5]) == "ab c"
    assert tok.decoded == [3, 2, 0]
    assert texts.text(tok, s, 0, [3, 5, b, 2]) == "ac '"  # not an extension: decoded whole
    assert texts.text(tok, s, 1, [3]) == "a"  # another row has its own memo
    assert tok.decoded == [3, 2, 0, 4, 1]


def test_the_memo_does_not_alias_the_callers_ids() -> None:
    tok, texts, s = RecordingTokenizer(UNITS), PartialTexts(), state()
    ids = [3, 4]
    texts.text(tok, s, 0, ids)
    ids[0] = 5  # a caller mutating a hypothesis's token list
    assert texts.text(tok, s, 0, [5, 4, 3]) == "cba"
    assert tok.decoded == [2, 3]


def test_another_tokenizer_decodes_whole() -> None:
    first, texts, s = RecordingTokenizer(UNITS), PartialTexts(), state()
    texts.text(first, s, 0, [3, 4])
    other = RecordingTokenizer([*UNITS[:3], "x", "y", *UNITS[5:]])
    assert texts.text(other, s, 0, [3, 4, 5]) == "xyc"
    assert other.decoded == [3]


def test_a_memo_leaves_with_its_state() -> None:
    tok, texts = CharTokenizer(UNITS), PartialTexts()
    kept, dropped = state(), state()
    texts.text(tok, kept, 0, [3])
    texts.text(tok, dropped, 0, [4])
    texts.text(tok, dropped, 1, [5])
    assert len(texts) == 3
    del dropped
    gc.collect()
    assert len(texts) == 1
    assert texts.text(tok, kept, 0, [3, 4]) == "ab"


def switching_log_probs(batch: int, frames: int, seed: int) -> torch.Tensor:
    """(B, T, V) log-probs with close competitors, so beams overtake each other."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames, V, generator=g)
    x[:, ::4, 0] += 3.0
    return x.log_softmax(-1)


def test_decoder_partials_equal_a_whole_decode_at_every_step() -> None:
    """Beam search (best hypotheses overtake each other) with a reset on the way: every
    partial's text is the whole decode; only tails of grown hypotheses were decoded."""
    tok = RecordingTokenizer(UNITS)
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=4), tok, device="cpu")
    states = [dec.create_state(1, V) for _ in range(3)]
    lp = switching_log_probs(3, 64, 0)
    seen: list[list[int] | None] = [None] * 3
    expected, switched = [], 0
    for step, start in enumerate(range(0, 64, 2)):  # a partial every 2 frames
        if step == 20:
            dec.reset_state(states[1], 1, V)
        dec.decode_streams(lp[:, start:start + 2], states)
        for i, hyp in enumerate(p.hypothesis for p in dec.partials(states)):
            assert hyp.text == CharTokenizer(UNITS).decode(hyp.tokens)
            prev = seen[i]
            grown = prev is not None and hyp.tokens[: len(prev)] == prev
            switched += prev is not None and not grown
            expected.append(len(hyp.tokens) - len(prev) if grown and prev else len(hyp.tokens))
            seen[i] = hyp.tokens
    assert switched >= 4  # beams overtook each other: the memo was checked, not trusted
    assert tok.decoded == expected
