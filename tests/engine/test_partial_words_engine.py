"""The words of live partials through the engine (`oasr.engine.live.words.PartialWords`):
computed from what the last partial computed, they are the words computed from scratch, for
every partial of real speech."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import run_until_idle, stream_all
from support.paths import DEVSET_DIR

from oasr.audio import read_audio
from oasr.engine import ASREngine, EngineConfig, Partial
from oasr.engine.live import words as live_words
from oasr.engine.live.words import PartialWords, ctc_letters, timed_words

pytestmark = pytest.mark.slow

CLIPS = ["real_jfk.wav", "real_sense_and_sensibility_01_austen_64kb-0870.wav",
         "real_sense_and_sensibility_01_austen_64kb-0930.wav"]


def test_every_partials_words_are_the_words_computed_from_scratch(monkeypatch) -> None:
    checked: list[tuple[int, int]] = []  # (words, words timed again) per partial
    revised = 0  # partials whose hypothesis changed a token before the segment's last one's last
    last_tokens: dict[int, list[int]] = {}  # segment start -> its last partial's tokens
    place, words = live_words._place, PartialWords.words
    placed: list[int] = []

    def counted_place(new_words, *args, **kwargs):
        placed.append(len(new_words))
        return place(new_words, *args, **kwargs)

    def compared_words(self, text, hyp, posteriors, span, frame_shift_s):
        nonlocal revised
        placed.clear()
        got = words(self, text, hyp, posteriors, span, frame_shift_s)
        checked.append((len(got), sum(placed)))
        letters = ctc_letters(self.tokenizer, hyp, span[0], posteriors)
        assert got == timed_words(text, letters, span, frame_shift_s), (text, span)
        if hyp is not None:
            before = last_tokens.get(span[0], [])
            if list(hyp.tokens[: len(before) - 1]) != before[:-1]:
                revised += 1
            last_tokens[span[0]] = list(hyp.tokens)
        return got

    monkeypatch.setattr(live_words, "_place", counted_place)
    monkeypatch.setattr(PartialWords, "words", compared_words)
    audio = np.concatenate([read_audio(DEVSET_DIR / clip) for clip in CLIPS])
    engine = ASREngine(EngineConfig(max_batch_size=1, max_num_blocks=64, num_threads=1))
    events = stream_all(engine, audio)
    run_until_idle(engine)

    partials = events.of_type(1, Partial)
    assert len(checked) == len(partials) > 20
    assert revised > 0  # the beam search revised earlier words: the kept prefix shrank
    num_words, num_timed = sum(n for n, _ in checked), sum(t for _, t in checked)
    assert num_timed < num_words / 2  # most words were kept from the last partial
