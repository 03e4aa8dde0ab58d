"""Where a transcript's last sentence ends, from the punctuation Whisper writes."""

import pytest

from oasr.text.sentences import as_context, ends_sentence, unfinished_words, without_leading_marks


@pytest.mark.parametrize("text", ["He was not an ill-disposed young man.",
                                  "Will you walk to the park?", "Ask not!",
                                  '"It is over," she said. "Go home."',
                                  "(and then we left.)", "We counted 42 boxes."])
def test_a_closed_sentence_ends(text: str) -> None:
    assert ends_sentence(text)


@pytest.mark.parametrize("text", ["He was not an ill-disposed", "in the superlative degree,",
                                  "and then we...", "and then we\u2026", "the letter to Mr.",
                                  "the house of Mrs.", "", "   "])
def test_an_open_sentence_does_not(text: str) -> None:
    assert not ends_sentence(text)


def test_a_sentence_needs_its_words() -> None:
    assert ends_sentence("Yes.")
    assert not ends_sentence("Yes.", min_words=3)
    assert not ends_sentence("Oh, yes.", min_words=3)
    assert ends_sentence("Oh, yes please.", min_words=3)


@pytest.mark.parametrize(("text", "words"), [
    ("the rightful property of someone or other", 7),
    ("He was not ill-disposed. Unless to be rather", 4),
    ("He was not ill-disposed.", 0), ("Will he come?", 0), ("", 0),
    ("the letter to Mr.", 4)])  # a title's period ends no sentence
def test_the_words_a_segment_left_of_its_sentence(text: str, words: int) -> None:
    assert unfinished_words(text) == words


@pytest.mark.parametrize(("text", "context"), [
    ("the children played outside until it was dark",
     "the children played outside until it was dark."),  # Whisper's unpunctuated style
    (" our flight was delayed ", "our flight was delayed."),
    ("He was not an ill-disposed young man", "He was not an ill-disposed young man"),
    ("unless to be rather cold-hearted, and", "unless to be rather cold-hearted, and"),
    ("It was dark.", "It was dark."), ("ask not", "ask not"), ("", "")])
def test_a_context_in_whisper_s_unpunctuated_style_is_closed(text: str, context: str) -> None:
    assert as_context(text) == context


@pytest.mark.parametrize(("text", "kept"), [
    (". And so on.", "And so on."), ("?, yes", "yes"), ("\u2026 well", "well"),
    ("And so on.", "And so on."), ('"Go home."', '"Go home."'), ("(and then)", "(and then)"),
    ("...", ""),
])
def test_the_marks_a_text_begins_with_are_dropped(text: str, kept: str) -> None:
    assert without_leading_marks(text) == kept
