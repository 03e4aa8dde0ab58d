"""Offline transcription of files through the streaming engine (``oasr transcribe``).

Every file is one stream; they run concurrently, so a directory of files costs about as many
engine steps as its longest file, not the sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.decoding.context import Hotwords
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.events import Done, Error, Final, StreamEvent


@dataclass
class FileResult:
    """One file's transcript: the finals joined, each segment with its times."""

    file: str
    segments: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = ""
    error: str | None = None

    @property
    def text(self) -> str:
        return " ".join(s["text"] for s in self.segments if s["text"])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "text": self.text, "segments": self.segments,
                               "finish_reason": self.finish_reason}
        if self.error is not None:
            out["error"] = self.error
        return out

    def on_event(self, event: StreamEvent) -> None:
        match event:
            case Final():
                self.segments.append({"text": event.text, "start": round(event.start, 3),
                                      "end": round(event.end, 3), "reason": event.reason,
                                      "source": event.source})
            case Done():
                self.finish_reason = event.finish_reason
            case Error():
                self.error = f"{event.code}: {event.message}"


def transcribe_files(config: EngineConfig, files: Sequence[Path | str], progress: bool = True,
                     engine: ASREngine | None = None, hotwords: Sequence[object] = (),
                     prompt: str = "") -> list[FileResult]:
    """Transcribe ``files`` as concurrent streams of one engine; results in input order.
    ``hotwords`` (phrases or ``{"phrase", "boost"}``) and ``prompt`` bias every file's
    streams (`oasr.decoding.context.Hotwords`).

    An engine given is left running (its caller shuts it down); one made here is shut down
    before returning, so its second-pass thread does not outlive the call.

    Raises:
        HotwordError: bad hotwords (before any file is read)."""
    owned = engine is None
    engine = engine if engine is not None else ASREngine(config)
    try:
        bias = Hotwords.build(list(hotwords), engine.resources.hotword_tokenizer, prompt)
    except ValueError:
        if owned:
            engine.shutdown()
        raise
    results = [FileResult(str(f)) for f in files]
    total_s = 0.0
    for stream_id, (path, result) in enumerate(zip(files, results, strict=True), start=1):
        try:
            audio = read_audio(path)
        except (OSError, ValueError) as exc:
            result.error = f"unreadable: {exc}"
            continue
        total_s += len(audio) / MODEL_SAMPLE_RATE
        engine.submit(OpenStream(stream_id, result.on_event, hotwords=bias if bias else None))
        engine.submit(AppendAudio(stream_id, audio))
        engine.submit(EndStream(stream_id))
    bar = tqdm(total=round(total_s, 1), unit="s", desc="transcribing", disable=not progress,
               leave=False)
    with bar:
        while True:
            if not engine.step():
                engine.wait_for_work(0.05)  # only the second pass is still working
            # the decoded audio counts each stream's last chunk in full: at most the total
            bar.update(min(round(engine.stats.total_audio_s, 1), bar.total) - bar.n)
            if engine.is_idle:
                break
    if owned:
        engine.shutdown()
    return results
