"""The guard and a stream's hotwords: a final is not rejected for a hotword Whisper wrote, and
the CTC pass's hotwords replace Whisper's near misses of them."""

from __future__ import annotations

import pytest

from oasr.engine.second_pass.guard import FirstPassGuard, respell_hotwords, without_hotwords


def test_a_hotword_and_the_ctc_span_closest_to_it_leave_the_comparison() -> None:
    mine, theirs = without_hotwords("call oyelaran now", "call oil a ran now", ("Oyelaran",))
    assert (mine, theirs) == (["call", "now"], ["call", "now"])
    # a hotword Whisper did not write changes nothing
    assert without_hotwords("call him now", "call oil a ran now", ("Oyelaran",)) == (
        ["call", "him", "now"], ["call", "oil", "a", "ran", "now"])


def test_a_final_is_not_rejected_for_containing_a_hotword() -> None:
    guard = FirstPassGuard()
    whisper, ctc = "Xochitl Tlatelolco", "so she till that a low co said it"
    assert guard.rejection(whisper, ctc) == "distance"
    assert guard.rejection(whisper, ctc, hotwords=("Xochitl", "Tlatelolco")) is None
    whisper = "Xochitl Tlatelolco said it."  # a name heard as several words leaves whole
    assert guard.rejection(whisper, ctc, hotwords=("Xochitl", "Tlatelolco")) is None
    # the rest of the text is still compared
    assert guard.rejection("Oyelaran sold the whole house to his sister",
                           "oil a ran went to the station early", hotwords=("Oyelaran",)) \
        == "distance"


@pytest.mark.parametrize(("whisper", "ctc", "hotwords", "expected"), [
    ("The engineers tested the Delrasso engine.", "the engineers tested the ildrasso ending",
     ("Ildrasso",), "The engineers tested the Ildrasso engine."),
    ("Sibrenor wrote the music.", "sibrenna roll to music", ("Sibrenna",),
     "Sibrenna wrote the music."),
    ('Follow the signs to "Fenwyke."', "follow the signs to fenwycke", ("Fenwycke",),
     'Follow the signs to "Fenwycke."'),
    ("Call New Yorg now.", "call new york now", ("New York",), "Call New York now."),
])
def test_whisper_near_misses_take_the_hotword_the_ctc_pass_spelled(
        whisper: str, ctc: str, hotwords: tuple[str, ...], expected: str) -> None:
    assert respell_hotwords(whisper, ctc, hotwords) == expected


@pytest.mark.parametrize(("whisper", "ctc", "hotwords"), [
    ("I saw the cat.", "i saw theo cat", ("Theo",)),  # a common word Whisper wrote lower case
    ("The storm hit Hever.", "the storm hit haver", ("Halvenor",)),  # the CTC pass missed it
    ("Ask Tom now.", "ask kestrova now", ("Kestrova",)),  # not alike enough
    ("Ask Kestrova now.", "ask kestrova now", ("Kestrova",)),  # already right
    ("Ask Kestrova now.", "ask kestrova now", ()),
])
def test_no_respelling_without_evidence(whisper: str, ctc: str,
                                        hotwords: tuple[str, ...]) -> None:
    assert respell_hotwords(whisper, ctc, hotwords) is None
