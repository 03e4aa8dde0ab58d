"""The serving engine: config, scheduler, model runner, the step loop and its thread."""

from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.events import Done, Error, Final, FinishReason, Partial, Ready, StreamEvent
from oasr.engine.offline import FileResult, transcribe_files
from oasr.engine.process import configure_process, freeze_startup_objects
from oasr.engine.thread import EngineThread

__all__ = [
    "ASREngine",
    "EngineConfig",
    "EngineThread",
    "Done",
    "Error",
    "FileResult",
    "Final",
    "FinishReason",
    "Partial",
    "Ready",
    "StreamEvent",
    "configure_process",
    "freeze_startup_objects",
    "transcribe_files",
]
