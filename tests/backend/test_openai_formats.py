"""The transcription API's formats: subtitle clocks and word times aligned to the CTC words."""

from __future__ import annotations

from backend.openai_formats import Segment, align_words, to_srt, to_verbose_json, to_vtt

CTC = (("an", 0.44, 0.56), ("soal", 0.7, 0.98), ("my", 1.08, 1.14),
       ("felearecas", 1.42, 2.32), ("ask", 3.42, 3.8))


def test_words_the_ctc_pass_heard_take_its_times() -> None:
    segment = Segment("And so my fellow Americans. Ask", 0.44, 3.8, CTC)
    words = align_words(segment)
    assert [w for w, _, _ in words] == ["And", "so", "my", "fellow", "Americans", "Ask"]
    assert words[2] == ("my", 1.08, 1.14) and words[5] == ("Ask", 3.42, 3.8)
    # 'And so' for 'an soal' (2 for 2), 'fellow Americans' for 'felearecas' share its span
    assert words[0][1] == 0.44 and words[1][2] == 0.98
    assert words[3][1] == 1.42 and words[4][2] == 2.32 and words[3][2] == words[4][1]
    assert all(s <= e for _, s, e in words)
    assert [s for _, s, _ in words] == sorted(s for _, s, _ in words)


def test_words_the_ctc_pass_missed_share_the_gap() -> None:
    segment = Segment("my dear fellow", 1.0, 3.0, (("my", 1.0, 1.2), ("fellow", 2.0, 2.5)))
    assert align_words(segment) == [("my", 1.0, 1.2), ("dear", 1.2, 2.0),
                                    ("fellow", 2.0, 2.5)]
    tail = Segment("my friend", 1.0, 3.0, (("my", 1.0, 1.2),))
    assert align_words(tail) == [("my", 1.0, 1.2), ("friend", 1.2, 3.0)]
    assert align_words(Segment("hello", 0.5, 1.0)) == [("hello", 0.5, 1.0)]


def test_subtitle_clocks() -> None:
    segments = [Segment("one", 0.0, 1.25), Segment("", 2.0, 2.5), Segment("two", 3661.5, 3662.0)]
    assert to_srt(segments) == ("1\n00:00:00,000 --> 00:00:01,250\none\n\n"
                                "2\n01:01:01,500 --> 01:01:02,000\ntwo\n")
    assert to_vtt(segments) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\none\n\n"
                                "01:01:01.500 --> 01:01:02.000\ntwo\n")


def test_verbose_json_granularities() -> None:
    segments = [Segment("my friend", 1.0, 3.0, (("my", 1.0, 1.2),))]
    both = to_verbose_json(segments, 3.0, "en", 0.0, ("word", "segment"))
    assert both["words"][0] == {"word": "my", "start": 1.0, "end": 1.2}
    assert len(both["segments"]) == 1
    words_only = to_verbose_json(segments, 3.0, "en", 0.0, ("word",))
    assert "segments" not in words_only and len(words_only["words"]) == 2
    assert "words" not in to_verbose_json(segments, 3.0, "en", 0.0)
