"""The response formats of ``POST /v1/audio/transcriptions``: json, text, srt, vtt,
verbose_json, and the server-sent events of ``stream=true``.

A transcript here is the stream's segment finals (``Segment``), each with its start and end in
seconds of the file. Segment times come from the CTC pass's token timestamps (the frames that
emitted the segment's first and last tokens); the text is the second pass's (Whisper) when it
ran, else the CTC text.

Word times come from the CTC pass too (``align_words``): the final's words are aligned to the
CTC words (difflib, on lowercased letters); a word the CTC pass also heard takes its frames,
words of a stretch it heard differently share that stretch's span by length, and words it did
not hear share the gap where they fall.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
LANGUAGE_NAMES = {"en": "english"}


@dataclass(frozen=True)
class Segment:
    text: str
    start: float
    end: float
    ctc_words: tuple[tuple[str, float, float], ...] = field(default=())


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def _spread(words: list[str], start: float, end: float) -> list[tuple[str, float, float]]:
    """``words`` sharing ``start..end`` in proportion to their lengths."""
    total = sum(len(w) for w in words) or 1
    out, at = [], start
    for word in words:
        step = (end - start) * len(word) / total
        out.append((word, round(at, 3), round(at + step, 3)))
        at += step
    return out


def align_words(segment: Segment) -> list[tuple[str, float, float]]:
    """The segment's words (punctuation stripped) with times from its CTC words."""
    words = [w.strip(".,!?;:\"()[]") for w in segment.text.split()]
    words = [w for w in words if w]
    ctc = list(segment.ctc_words)
    matcher = difflib.SequenceMatcher(a=[_norm(w) for w in words],
                                      b=[_norm(w) for w, _, _ in ctc], autojunk=False)
    out: list[tuple[str, float, float]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += [(words[i], ctc[j][1], ctc[j][2]) for i, j in zip(range(i1, i2),
                                                                   range(j1, j2), strict=True)]
        elif tag == "replace":
            out += _spread(words[i1:i2], ctc[j1][1], ctc[j2 - 1][2])
        elif tag == "delete":  # words of the final the CTC pass did not hear
            gap_start = out[-1][2] if out else segment.start
            gap_end = ctc[j1][1] if j1 < len(ctc) else max(segment.end, gap_start)
            out += _spread(words[i1:i2], gap_start, max(gap_end, gap_start))
    return out


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
                    temperature: float, granularities: tuple[str, ...] = ()) -> dict[str, Any]:
    """OpenAI's verbose transcription: ``segments`` unless only words were asked for, and
    ``words`` when they were. Fields oasr does not compute (Whisper's token ids, average
    log-probability, compression ratio, no-speech probability) are null or empty."""
    spoken = [s for s in segments if s.text]
    body: dict[str, Any] = {
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
    if "word" in granularities:
        body["words"] = [{"word": w, "start": s, "end": e}
                         for segment in spoken for w, s, e in align_words(segment)]
        if "segment" not in granularities:
            del body["segments"]
    return body


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
