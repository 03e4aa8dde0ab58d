"""EngineThread: the engine loop on a background thread, and the thread-safe calls that feed it.

Only the engine thread touches the caches, the model and the decoders. Callers
(websocket handlers, the transcribe command) decode and resample their own audio in their own
thread, then hand 16 kHz float32 samples over as commands; the engine applies them between
steps and answers through each stream's event sink.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from oasr.audio import (
    MODEL_SAMPLE_RATE,
    PCM_FORMATS,
    StreamingResampler,
    decode_pcm,
    validate_sample_rate,
)
from oasr.decoding.context import Hotwords
from oasr.engine.commands import (
    AbortStream,
    AppendAudio,
    EndStream,
    FinishAll,
    OpenStream,
    ResumeStream,
    SetHotwords,
    SuspendStream,
)
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.events import Done, Error, FinishReason, StreamEvent
from oasr.engine.request import EventSink
from oasr.engine.snapshot import EngineSnapshot

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.25  # how often an idle engine wakes to enforce timeouts


@dataclass
class _StreamInput:
    """Caller-side state of one stream: its PCM format, resampler, sink and samples fed."""

    fmt: str
    resampler: StreamingResampler
    sink: EventSink
    ended: bool = False
    num_samples_fed: int = 0  # 16 kHz samples handed to the engine


class EngineThread:
    """Runs `ASREngine.step` on a background thread; every public method is thread-safe.

    Invariant: a stream id is in ``_inputs`` from `open_stream` until its terminal event
    (done, or a busy refusal) has been handed to its sink; after that `feed_audio` raises
    KeyError and `end_stream` / `abort_stream` do nothing.
    """

    def __init__(self, config: EngineConfig | None = None, engine: ASREngine | None = None,
                 calibrate: bool = False):
        """``calibrate``: measure the step's cost (`ASREngine.calibrate`) on the thread before
        the loop serves; not ready until then."""
        self.engine = engine if engine is not None else ASREngine(config or EngineConfig())
        self._calibrate = calibrate
        self._serving = threading.Event()  # the loop is past its calibration
        self._inputs: dict[int, _StreamInput] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.last_beat = time.monotonic()  # the loop's last pass (liveness: is_stuck)
        # read for every message a socket receives (`queued_audio_s`): looked up once
        self._samples_per_frame = self.engine.family.timing.samples_per_frame

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine thread already started")
        self._thread = threading.Thread(target=self._run, name="oasr-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort every stream, stop the loop and join the thread."""
        self._stop.set()
        self.engine.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def ready(self) -> bool:
        """True while the loop serves (calibrated, when asked to be) and has not died."""
        return (self.is_alive() and self.error is None and not self._stop.is_set()
                and self._serving.is_set())

    def is_stuck(self, after_s: float) -> bool:
        """True when the loop is alive but has not come round for ``after_s`` seconds (a step
        that never returns); an idle loop comes round every ``IDLE_POLL_S``."""
        return self.is_alive() and time.monotonic() - self.last_beat > after_s

    def _run(self) -> None:
        try:
            if self._calibrate:
                cost = self.engine.calibrate()
                logger.info("a step costs %.4f s plus %.4f s per second of audio it decodes",
                            cost.fixed_s, cost.per_audio_s)
            self._serving.set()
            while not self._stop.is_set():
                self.last_beat = time.monotonic()
                if not self.engine.step():
                    self.engine.wait_for_work(IDLE_POLL_S)
            self.engine.shutdown()
        except BaseException as exc:  # the loop itself died: readiness must say so
            logger.exception("engine thread died")
            self.error = exc
            self._fail_every_stream(exc)

    def _fail_every_stream(self, exc: BaseException) -> None:
        """The loop died: tell every stream's owner (an error, then done "error") so no client
        waits for events that will never come."""
        with self._lock:
            streams = list(self._inputs.items())
            self._inputs.clear()
        message = f"the engine failed ({type(exc).__name__}: {exc}); the server restarts"
        for stream_id, stream in streams:
            try:
                stream.sink(Error(stream_id, "internal", message))
                stream.sink(Done(stream_id, FinishReason.ERROR.value))
            except Exception:
                logger.exception("could not tell stream %d that the engine failed", stream_id)

    # -- streams -------------------------------------------------------------------------------
    def hotwords(self, value: object = None, prompt: str = "") -> Hotwords:
        """A client's hotwords (a list of phrases or ``{"phrase", "boost"}`` objects) and
        prompt, checked and spelled for the served model (any thread).

        Raises:
            HotwordError: a term or prompt the limits refuse, or one the model cannot spell
                (the message names it; a ValueError).
        """
        return Hotwords.build(value, self.engine.resources.hotword_tokenizer, prompt)

    def open_stream(self, sample_rate: int = MODEL_SAMPLE_RATE, fmt: str = "s16le",
                    sink: EventSink | None = None,
                    endpoint_silence_s: float | None = None,
                    hotwords: Hotwords | Sequence[object] | None = None) -> int:
        """Register a new stream; admission (ready or busy) arrives later through ``sink``.

        ``endpoint_silence_s`` sets this stream's silence-after-speech endpoint (rule 2);
        ``hotwords`` (a `Hotwords`, or a client's list, checked by `hotwords`) bias both passes
        towards its terms, and ``ready`` echoes them.

        Raises:
            ValueError: unsupported sample rate or PCM format, or bad hotwords (HotwordError).
            RuntimeError: the engine loop has died.
        """
        if self.error is not None:
            raise RuntimeError(f"the engine is not running: it failed with {self.error!r}")
        if fmt not in PCM_FORMATS:
            raise ValueError(f"unsupported format {fmt!r}; use one of {', '.join(PCM_FORMATS)}")
        if endpoint_silence_s is not None and not 0 < endpoint_silence_s <= 60:
            raise ValueError(f"endpoint silence of {endpoint_silence_s} s; use 0..60 s")
        resampler = StreamingResampler(validate_sample_rate(sample_rate), MODEL_SAMPLE_RATE)
        if hotwords is not None and not isinstance(hotwords, Hotwords):
            hotwords = self.hotwords(hotwords)
        stream_id = next(self._ids)
        user_sink = sink if sink is not None else (lambda event: None)

        def deliver(event: StreamEvent) -> None:
            if event.is_terminal:
                with self._lock:
                    self._inputs.pop(stream_id, None)
            user_sink(event)

        with self._lock:
            self._inputs[stream_id] = _StreamInput(fmt, resampler, user_sink)
        self.engine.submit(OpenStream(stream_id, deliver, endpoint_silence_s,
                                      hotwords if hotwords else None))
        return stream_id

    def set_hotwords(self, stream_id: int, hotwords: Hotwords | Sequence[object] | None
                     ) -> Hotwords:
        """Replace the stream's hotwords (a `Hotwords`, or a client's list: `hotwords`; None:
        none) from its next chunk on; returns what was accepted.

        Raises:
            KeyError: the stream is unknown or already finished.
            ValueError: bad hotwords (HotwordError); the stream keeps its old ones.
        """
        self._get(stream_id)
        if not isinstance(hotwords, Hotwords):
            hotwords = self.hotwords(hotwords)
        self.engine.submit(SetHotwords(stream_id, hotwords))
        return hotwords

    def feed_audio(self, stream_id: int, data: bytes) -> None:
        """Decode, validate and resample ``data`` here, then queue it for the engine.

        Raises:
            KeyError: the stream is unknown or already finished.
            ValueError: the audio is malformed (message fit for the client), or came after end.
        """
        stream = self._get(stream_id)
        if stream.ended:
            raise ValueError("audio after end: the stream no longer accepts audio")
        samples = decode_pcm(data, stream.fmt)
        resampled = stream.resampler.process(samples)
        if resampled.size:
            stream.num_samples_fed += resampled.size
            self.engine.submit(AppendAudio(stream_id, resampled))

    def queued_audio_s(self, stream_id: int) -> float:
        """Seconds of the stream's audio handed over and not decoded yet (0 once finished).

        Read from the caller's thread: the engine's per-stream frame counter only grows and
        a dict lookup is atomic, so the value is at worst one step old.
        """
        with self._lock:
            stream = self._inputs.get(stream_id)
        if stream is None:
            return 0.0
        request = self.engine.requests.get(stream_id)
        decoded = 0 if request is None else (
            request.num_frames_decoded * self._samples_per_frame)
        return max(0, stream.num_samples_fed - decoded) / MODEL_SAMPLE_RATE

    def suspend_stream(self, stream_id: int, window_s: float) -> None:
        """The stream's client went away and may come back: keep the stream (its slot,
        caches, decoder state) for ``window_s`` seconds; it ends "abandoned" unless
        `resume_stream` comes first. Its events still go to its sink meanwhile."""
        self.engine.submit(SuspendStream(stream_id, window_s))

    def resume_stream(self, stream_id: int) -> None:
        """The suspended stream's client is back."""
        self.engine.submit(ResumeStream(stream_id))

    def finish_all(self, reason: FinishReason, message: str = "") -> None:
        """End every live stream at the next step with ``reason`` (its final, then done)."""
        self.engine.submit(FinishAll(reason, message))

    def end_stream(self, stream_id: int) -> None:
        """No more audio: flush the resampler and let the engine finish the stream."""
        with self._lock:
            stream = self._inputs.get(stream_id)
            if stream is None or stream.ended:
                return
            stream.ended = True
        tail = stream.resampler.flush()
        if tail.size:
            self.engine.submit(AppendAudio(stream_id, tail))
        self.engine.submit(EndStream(stream_id))

    def abort_stream(self, stream_id: int) -> None:
        """The client vanished: free the stream at the next step."""
        with self._lock:
            if stream_id not in self._inputs:
                return
        self.engine.submit(AbortStream(stream_id))

    def stats(self) -> EngineSnapshot:
        """The latest stats snapshot, stamped with liveness and wall time (``to_json()`` is
        what the stats API serves)."""
        return self.engine.latest_stats().stamped(self.ready, time.time())

    def _get(self, stream_id: int) -> _StreamInput:
        with self._lock:
            stream = self._inputs.get(stream_id)
        if stream is None:
            raise KeyError(f"stream {stream_id} is unknown or finished")
        return stream
