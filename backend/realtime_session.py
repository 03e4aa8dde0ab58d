"""The configuration of one ``/v1/realtime?intent=transcription`` session, parsed from
``session.update`` (GA) or ``transcription_session.update`` (beta), with no I/O.

What oasr honours: the input PCM rate (``audio/pcm`` at any rate 8..192 kHz; 24 kHz by default,
resampled to 16 kHz), ``server_vad`` turn detection (``silence_duration_ms`` becomes the
stream's silence-after-speech endpoint) or none (manual commits), transcription ``model`` (any
name), ``language`` (English), ``prompt`` (as OpenAI's: the text Whisper's second pass is
prompted with) and oasr's ``hotwords`` beside it (terms both passes are biased towards:
phrases or ``{"phrase", "boost"}`` objects, `oasr.decoding.context`), and ``include``
``item.input_audio_transcription.logprobs`` (each completed transcript's words with the
log of their confidence). Accepted and ignored, since the
endpointer judges silence from the CTC pass's blank frames rather than from energy:
``threshold``, ``prefix_padding_ms``, ``create_response``, ``interrupt_response``. Anything
else is a ``RealtimeError`` that names the field.

``server_vad``'s ``idle_timeout_ms`` (100..3,600,000, or null: off) is honoured as OpenAI does:
when no speech has been heard for that long since the session began, the last item ended or
the last timeout, the session sends ``input_audio_buffer.timeout_triggered`` and commits an
empty item (`backend.openai_realtime`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.audio import validate_sample_rate
from oasr.decoding.context import Hotword, HotwordError, parse_hotwords

DEFAULT_RATE = 24000
LOGPROBS = "item.input_audio_transcription.logprobs"  # the one ``include`` value oasr knows
IGNORED_VAD_FIELDS = ("threshold", "prefix_padding_ms", "create_response", "interrupt_response")


class RealtimeError(Exception):
    """A client mistake (or, with ``error_type="server_error"``, the server's), sent as an
    ``error`` event; the session stays open."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_value", event_id: str | None = None,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.event_id = message, param, code, event_id
        self.error_type = error_type

    def to_error(self) -> dict[str, Any]:
        return {"type": self.error_type, "code": self.code, "message": self.message,
                "param": self.param, "event_id": self.event_id}


@dataclass(frozen=True)
class TranscriptionSettings:
    """What a transcription session runs with.

    Attributes:
        sample_rate: Hz of the client's s16le PCM.
        server_vad: True: the engine's endpointer ends turns; False: the client commits.
        silence_ms: with ``server_vad``, the silence after speech that ends a turn; None
            keeps the engine's own rule.
        idle_timeout_ms: with ``server_vad``, the quiet (no speech) after which the session
            sends ``input_audio_buffer.timeout_triggered``; None: never.
        model, language: echoed back.
        prompt: Whisper's prompt (before the hotwords).
        hotwords: the terms both passes are biased towards.
        logprobs: ``completed`` events carry ``logprobs`` (``include`` asked for them).
    """

    sample_rate: int = DEFAULT_RATE
    server_vad: bool = True
    silence_ms: int | None = None
    idle_timeout_ms: int | None = None
    model: str = "oasr"
    language: str = "en"
    prompt: str = ""
    hotwords: tuple[Hotword, ...] = ()
    logprobs: bool = False

    def __post_init__(self) -> None:
        validate_sample_rate(self.sample_rate)
        if self.silence_ms is not None and not 100 <= self.silence_ms <= 60000:
            raise ValueError(f"silence_ms={self.silence_ms}; use 100..60000")
        if self.idle_timeout_ms is not None and not 100 <= self.idle_timeout_ms <= 3_600_000:
            raise ValueError(f"idle_timeout_ms={self.idle_timeout_ms}; use 100..3600000")

    def session_json(self, session_id: str, engine_silence_ms: int | None,
                     beta: bool) -> dict[str, Any]:
        """The session object of ``session.created`` / ``session.updated`` (or the beta's)."""
        silence = self.silence_ms if self.silence_ms is not None else engine_silence_ms
        vad = ({"type": "server_vad", "silence_duration_ms": silence, "threshold": None,
                "prefix_padding_ms": None, "idle_timeout_ms": self.idle_timeout_ms}
               if self.server_vad else None)
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt,
                         "hotwords": [h.to_json() for h in self.hotwords]}
        include = [LOGPROBS] if self.logprobs else []
        if beta:
            return {"id": session_id, "object": "realtime.transcription_session",
                    "input_audio_format": "pcm16", "input_audio_transcription": transcription,
                    "turn_detection": vad, "input_audio_noise_reduction": None,
                    "include": include}
        return {"id": session_id, "object": "realtime.transcription_session",
                "type": "transcription", "include": include,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.sample_rate},
                                    "transcription": transcription, "turn_detection": vad,
                                    "noise_reduction": None}}}


def _object(value: object, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RealtimeError(f"{param} must be an object, got {type(value).__name__}", param)
    return value


def _check_fields(obj: dict[str, Any], allowed: set[str], param: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        names = ", ".join(f"{param}.{u}" for u in unknown)
        raise RealtimeError(f"unknown or unsupported fields: {names}", f"{param}.{unknown[0]}",
                            code="unknown_parameter")


def apply_update(current: TranscriptionSettings, event: dict[str, Any]) -> TranscriptionSettings:
    """The settings after a ``session.update`` or ``transcription_session.update``.

    Raises:
        RealtimeError: a malformed, unknown or unsupported field (named in the message).
    """
    session = _object(event.get("session", {}), "session")
    if event["type"] == "transcription_session.update":
        return _apply_beta(current, session)
    _check_fields(session, {"type", "audio", "include", "object", "id"}, "session")
    if session.get("type", "transcription") != "transcription":
        raise RealtimeError(f"session.type {session.get('type')!r}: oasr serves transcription "
                            "sessions only", "session.type")
    current = _apply_include(current, session, "session.include")
    audio = _object(session.get("audio", {}), "session.audio")
    _check_fields(audio, {"input"}, "session.audio")
    audio_input = _object(audio.get("input", {}), "session.audio.input")
    param = "session.audio.input"
    _check_fields(audio_input, {"format", "transcription", "turn_detection", "noise_reduction"},
                  param)
    settings = current
    if "format" in audio_input:
        settings = _apply_format(settings, _object(audio_input["format"], f"{param}.format"))
    return _apply_common(settings, audio_input, param, "noise_reduction")


def _apply_beta(current: TranscriptionSettings, session: dict[str, Any]) -> TranscriptionSettings:
    _check_fields(session, {"input_audio_format", "input_audio_transcription", "turn_detection",
                            "input_audio_noise_reduction", "include", "modalities"}, "session")
    current = _apply_include(current, session, "session.include")
    fmt = session.get("input_audio_format", "pcm16")
    if fmt != "pcm16":
        raise RealtimeError(f"input_audio_format {fmt!r}: oasr takes pcm16 (24 kHz s16le)",
                            "session.input_audio_format", code="unsupported_value")
    renamed = {"transcription": session.get("input_audio_transcription"),
               "noise_reduction": session.get("input_audio_noise_reduction")}
    if "turn_detection" in session:
        renamed["turn_detection"] = session["turn_detection"]
    settings = dataclasses.replace(current, sample_rate=DEFAULT_RATE)
    return _apply_common(settings, renamed, "session", "input_audio_noise_reduction")


def _apply_include(settings: TranscriptionSettings, session: dict[str, Any],
                   param: str) -> TranscriptionSettings:
    """``include``: absent keeps the setting, a list sets it (only `LOGPROBS` is known)."""
    if "include" not in session:
        return settings
    include = session["include"]
    if include is None:
        include = []
    if not isinstance(include, list) or any(item != LOGPROBS for item in include):
        raise RealtimeError(f"{param} {include!r}: oasr can include only {LOGPROBS!r}", param,
                            code="unsupported_value")
    return dataclasses.replace(settings, logprobs=LOGPROBS in include)


def _apply_format(settings: TranscriptionSettings, fmt: dict[str, Any]) -> TranscriptionSettings:
    param = "session.audio.input.format"
    _check_fields(fmt, {"type", "rate"}, param)
    if fmt.get("type", "audio/pcm") != "audio/pcm":
        raise RealtimeError(f"{param}.type {fmt.get('type')!r}: oasr takes audio/pcm (s16le)",
                            f"{param}.type", code="unsupported_value")
    try:
        rate = validate_sample_rate(fmt.get("rate", DEFAULT_RATE))
    except ValueError as exc:
        raise RealtimeError(f"{param}.rate: {exc}", f"{param}.rate",
                            code="unsupported_value") from None
    return dataclasses.replace(settings, sample_rate=rate)


def _apply_common(settings: TranscriptionSettings, fields: dict[str, Any], param: str,
                  noise_name: str) -> TranscriptionSettings:
    if fields.get("noise_reduction") is not None:
        raise RealtimeError("noise reduction is not supported", f"{param}.{noise_name}",
                            code="unsupported_value")
    transcription = fields.get("transcription")
    if transcription is not None:
        settings = _apply_transcription(settings, _object(transcription, f"{param}.transcription"),
                                        f"{param}.transcription")
    if "turn_detection" in fields:
        settings = _apply_turn_detection(settings, fields["turn_detection"],
                                         f"{param}.turn_detection")
    return settings


def _apply_transcription(settings: TranscriptionSettings, fields: dict[str, Any],
                         param: str) -> TranscriptionSettings:
    _check_fields(fields, {"model", "language", "prompt", "hotwords"}, param)
    language = str(fields.get("language") or "en").lower()
    if language not in ("en", "english"):
        raise RealtimeError(f"language {language!r} is not supported: the served model "
                            "transcribes English ('en')", f"{param}.language",
                            code="unsupported_value")
    prompt = fields.get("prompt", settings.prompt)
    if prompt is not None and not isinstance(prompt, str):
        raise RealtimeError(f"{param}.prompt must be a string", f"{param}.prompt")
    hotwords = settings.hotwords
    if "hotwords" in fields:
        try:
            hotwords = parse_hotwords(fields["hotwords"], f"{param}.hotwords")
        except HotwordError as exc:
            raise RealtimeError(str(exc), f"{param}.hotwords", code="bad_hotwords") from None
    return dataclasses.replace(settings, model=str(fields.get("model") or settings.model),
                               language="en", prompt=prompt or "", hotwords=hotwords)


def _apply_turn_detection(settings: TranscriptionSettings, value: object,
                          param: str) -> TranscriptionSettings:
    if value is None:
        return dataclasses.replace(settings, server_vad=False, silence_ms=None,
                                   idle_timeout_ms=None)
    fields = _object(value, param)
    _check_fields(fields, {"type", "silence_duration_ms", "idle_timeout_ms",
                           *IGNORED_VAD_FIELDS}, param)
    if fields.get("type", "server_vad") != "server_vad":
        raise RealtimeError(f"{param}.type {fields.get('type')!r}: oasr supports server_vad "
                            "or null (manual commits)", f"{param}.type",
                            code="unsupported_value")
    silence = fields.get("silence_duration_ms")
    if silence is not None and (isinstance(silence, bool) or not isinstance(silence, int)
                                or not 100 <= silence <= 60000):
        raise RealtimeError(f"{param}.silence_duration_ms {silence!r}: use 100..60000",
                            f"{param}.silence_duration_ms")
    idle = fields.get("idle_timeout_ms")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int)
                             or not 100 <= idle <= 3_600_000):
        raise RealtimeError(f"{param}.idle_timeout_ms {idle!r}: use 100..3600000 (or null: "
                            "off)", f"{param}.idle_timeout_ms")
    return dataclasses.replace(settings, server_vad=True, silence_ms=silence,
                               idle_timeout_ms=idle)
