"""Feeding a file to an OpenAI-compatible realtime transcription socket as a live client does.

Shared by ``bench/openai_wer.py`` and the SDK tests: the audio as 24 kHz 16-bit PCM (the
realtime API's default format) with trailing silence, appended in 100 ms pieces at real-time
pace on a thread while the caller reads the server's events.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from oasr.audio import MODEL_SAMPLE_RATE, read_audio

REALTIME_RATE = 24_000  # the realtime API's default audio/pcm rate
PIECE_S = 0.1
TRAILING_SILENCE_S = 1.5  # lets the server's VAD see the end of the last turn


def realtime_pcm(path: Path) -> bytes:
    """``path`` as 24 kHz mono s16le, followed by ``TRAILING_SILENCE_S`` of silence."""
    audio = soxr.resample(read_audio(path), MODEL_SAMPLE_RATE, REALTIME_RATE)
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    return pcm + bytes(int(REALTIME_RATE * TRAILING_SILENCE_S) * 2)


def start_feeding(conn: Any, pcm: bytes, manual: bool) -> threading.Thread:
    """Append ``pcm`` to an open realtime connection (``openai`` SDK) in 100 ms pieces at
    real-time pace on a new thread; commit the buffer at the end when turns are ``manual``,
    then send a ``session.update`` that marks the end of input. The thread is started."""
    piece = int(REALTIME_RATE * PIECE_S) * 2

    def feed() -> None:
        start = time.monotonic()
        for n, i in enumerate(range(0, len(pcm), piece)):
            conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + piece]).decode())
            time.sleep(max(0.0, start + (n + 1) * PIECE_S - time.monotonic()))
        if manual:
            conn.input_audio_buffer.commit()
        conn.session.update(session={"type": "transcription"})  # marks the end of input

    feeder = threading.Thread(target=feed)
    feeder.start()
    return feeder
