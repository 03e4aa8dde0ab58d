"""The /ws/asr state machine without any I/O: every legal and illegal transition."""

from __future__ import annotations

import pytest

from backend.protocol import (
    CloseCode,
    EndRequest,
    ProtocolError,
    Session,
    SessionState,
    StartRequest,
    close_code_for,
)


def session() -> Session:
    return Session(max_frame_bytes=8000, max_text_bytes=256)


def refused(action, code: str) -> ProtocolError:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as caught:
        action()
    assert caught.value.code == code
    return caught.value


def test_start_then_audio_then_end() -> None:
    s = session()
    assert s.on_text('{"type": "start", "sample_rate": 48000, "format": "f32le"}') == \
        StartRequest(48000, "f32le")
    assert s.state is SessionState.STREAMING
    assert s.on_audio(b"\x00" * 400) is None
    assert s.on_text('{"type": "end"}') == EndRequest()
    assert s.state is SessionState.ENDED


def test_start_defaults_and_integral_float_rate() -> None:
    assert session().on_text('{"type": "start"}') == StartRequest(16000, "s16le")
    assert session().on_text('{"type": "start", "sample_rate": 44100.0}') == \
        StartRequest(44100, "s16le")


def test_first_audio_is_an_implicit_default_start() -> None:
    s = session()
    assert s.on_audio(b"\x00\x00") == StartRequest()
    assert s.on_audio(b"\x00\x00") is None
    assert s.state is SessionState.STREAMING


def test_second_start_and_start_after_audio_have_their_own_messages() -> None:
    s = session()
    s.on_text('{"type": "start"}')
    assert "second start" in refused(lambda: s.on_text('{"type": "start"}'), "bad_request").message
    s2 = session()
    s2.on_audio(b"\x00\x00")
    assert "start after audio" in refused(
        lambda: s2.on_text('{"type": "start"}'), "bad_request").message
    assert s.state is s2.state is SessionState.STREAMING


def test_end_before_start_a_second_end_and_audio_after_end() -> None:
    s = session()
    refused(lambda: s.on_text('{"type": "end"}'), "bad_request")
    assert s.state is SessionState.AWAITING_START
    s.on_text('{"type": "start"}')
    s.on_text('{"type": "end"}')
    refused(lambda: s.on_text('{"type": "end"}'), "bad_request")
    assert "audio after end" in refused(lambda: s.on_audio(b"\x00\x00"), "bad_request").message
    assert s.state is SessionState.ENDED


@pytest.mark.parametrize("text", ["", "nope", "[]", "null", "3", '"start"', '{"type": 1}',
                                  '{"type": "pause"}', '{"type": "start", "extra": 1}'])
def test_malformed_messages(text: str) -> None:
    error = refused(lambda: session().on_text(text), "bad_request")
    assert error.close_code == CloseCode.POLICY_VIOLATION


@pytest.mark.parametrize("start", ['{"type": "start", "sample_rate": 1}',
                                   '{"type": "start", "sample_rate": 1e12}',
                                   '{"type": "start", "sample_rate": "16000"}',
                                   '{"type": "start", "sample_rate": NaN}',
                                   '{"type": "start", "sample_rate": true}',
                                   '{"type": "start", "format": "pcm"}',
                                   '{"type": "start", "format": null}'])
def test_unsupported_rates_and_formats(start: str) -> None:
    s = session()
    error = refused(lambda: s.on_text(start), "unsupported")
    assert error.close_code == CloseCode.UNSUPPORTED_DATA
    assert s.state is SessionState.AWAITING_START


def test_size_limits_name_both_numbers() -> None:
    error = refused(lambda: session().on_audio(b"\x00" * 8002), "too_large")
    assert "8002" in error.message and "8000" in error.message
    assert error.close_code == CloseCode.MESSAGE_TOO_BIG
    refused(lambda: session().on_text('{"type": "start", "x": "' + "a" * 300 + '"}'), "too_large")


def test_error_json_and_close_codes() -> None:
    assert ProtocolError("busy", "full").to_json() == \
        {"type": "error", "code": "busy", "message": "full"}
    assert close_code_for("busy") == 1013
    assert close_code_for("bad_audio") == 1003
    assert close_code_for("something_new") == 1011
