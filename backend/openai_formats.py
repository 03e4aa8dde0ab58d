"""The response formats of ``POST /v1/audio/transcriptions``: json, text, srt, vtt,
verbose_json, and the server-sent events of ``stream=true``.

A transcript here is the stream's segment finals (``Segment``), each with its start and end in
seconds of the file. Segment times come from the CTC pass's token timestamps (the frames that
emitted the segment's first and last tokens); the text is the second pass's (Whisper) when it
ran, else the CTC text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
LANGUAGE_NAMES = {"en": "english"}


@dataclass(frozen=True)
class Segment:
    text: str
    start: float
    end: float


def transcript_text(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)


def _clock(seconds: float, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def to_srt(segments: list[Segment]) -> str:
    cues = [f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text}\n"
            for i, s in enumerate((s for s in segments if s.text), start=1)]
    return "\n".join(cues)


def to_vtt(segments: list[Segment]) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text}\n"
            for s in segments if s.text]
    return "WEBVTT\n\n" + "\n".join(cues)


def to_verbose_json(segments: list[Segment], duration_s: float, language: str,
                    temperature: float) -> dict[str, Any]:
    """OpenAI's verbose transcription. Fields oasr does not compute (Whisper's token ids,
    average log-probability, compression ratio, no-speech probability) are null or empty."""
    spoken = [s for s in segments if s.text]
    return {
        "task": "transcribe",
        "language": LANGUAGE_NAMES.get(language, language),
        "duration": round(duration_s, 3),
        "text": transcript_text(segments),
        "segments": [
            {"id": i, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3),
             "text": s.text, "tokens": [], "temperature": temperature, "avg_logprob": None,
             "compression_ratio": None, "no_speech_prob": None}
            for i, s in enumerate(spoken)],
        "usage": {"type": "duration", "seconds": round(duration_s, 3)},
    }


def to_json(segments: list[Segment], duration_s: float) -> dict[str, Any]:
    return {"text": transcript_text(segments),
            "usage": {"type": "duration", "seconds": round(duration_s, 3)}}


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``event`` as JSON data."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def delta_event(text: str, segment: int) -> dict[str, Any]:
    return {"type": "transcript.text.delta", "delta": text, "segment_id": f"seg_{segment}"}


def done_event(text: str) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": text}
