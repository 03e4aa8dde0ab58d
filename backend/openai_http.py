"""OpenAI's HTTP transcription API: ``POST /v1/audio/transcriptions`` and ``GET /v1/models``.

An uploaded file becomes one stream of the same engine the live sockets use (its own slot,
batched with them): decoded and resampled to 16 kHz by ``oasr.audio.read_audio`` (as ``oasr
transcribe`` does), fed a little ahead of decoding, and answered once the stream's ``done``
has followed its last final, so every segment carries the second pass's text when it ran.

Accepted and documented as such: ``model`` (any name), ``prompt`` (ignored),
``temperature`` (0..1, ignored: decoding is greedy), ``language`` (``en`` only: the served
models are English), ``timestamp_granularities[]`` ``segment`` and ``word`` (with
``verbose_json``; times from the CTC pass, see ``openai_formats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import Message, Receive

from backend import openai_formats as fmt
from backend.auth import openai_error
from backend.engine_stream import EngineStream, feed_paced, is_busy
from oasr.audio import MODEL_SAMPLE_RATE, read_audio
from oasr.engine import EngineThread
from oasr.engine.events import Done, Error, Final

FORM_FIELDS = frozenset({"file", "model", "language", "prompt", "response_format",
                         "temperature", "timestamp_granularities[]", "stream"})
MAX_AHEAD_S = 10.0  # audio fed ahead of decoding; well under the engine's pending limit
ENGLISH = ("en", "english")


class BadRequest(Exception):
    """A client mistake: answered with ``status`` and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def response(self) -> JSONResponse:
        error_type = "invalid_request_error" if self.status < 500 else "server_error"
        return JSONResponse(openai_error(self.message, error_type, self.code, self.param),
                            status_code=self.status)


@dataclass(frozen=True)
class TranscriptionParams:
    response_format: str = "json"
    language: str = "en"
    temperature: float = 0.0
    stream: bool = False
    granularities: tuple[str, ...] = ()


def too_large(limit: int) -> BadRequest:
    return BadRequest(f"the request body is larger than the limit of {limit} bytes",
                      status=413, code="request_too_large")


def limited_receive(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises 413 once the body passes ``limit`` bytes (whatever
    Content-Length claimed)."""
    num_bytes = 0

    async def wrapped() -> Message:
        nonlocal num_bytes
        message = await receive()
        num_bytes += len(message.get("body", b""))
        if num_bytes > limit:
            raise too_large(limit)
        return message

    return wrapped


async def transcriptions(request: Request) -> Response:
    context = request.app.state.context
    limit = context.config.max_upload_bytes
    try:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise too_large(limit)
        limited = Request(request.scope, limited_receive(request.receive, limit))
        try:
            async with limited.form(max_files=1, max_fields=len(FORM_FIELDS) + 4) as form:
                params = parse_params(form)
                samples = await asyncio.to_thread(decode_upload, form.get("file"))
        except HTTPException as exc:
            raise BadRequest(f"the multipart form could not be read: {exc.detail}") from None
        if context.engine is None or not context.is_ready:
            raise BadRequest("the engine is not ready yet", status=503, code="not_ready")
        return await _answer(context.engine, samples, params)
    except BadRequest as error:
        return error.response()


def parse_params(form: FormData) -> TranscriptionParams:
    """Validate the form's fields (``file`` is decoded separately).

    Raises:
        BadRequest: an unknown field, or a value oasr does not support, naming the field.
    """
    unknown = sorted(set(form.keys()) - FORM_FIELDS)
    if unknown:
        raise BadRequest(f"unknown or unsupported fields {unknown}", param=unknown[0])
    if not form.get("model"):
        raise BadRequest("'model' is required (any name: see GET /v1/models)", param="model")
    response_format = str(form.get("response_format") or "json")
    if response_format not in fmt.RESPONSE_FORMATS:
        raise BadRequest(f"response_format {response_format!r}: use one of "
                         f"{list(fmt.RESPONSE_FORMATS)}", param="response_format")
    language = str(form.get("language") or "en").lower()
    if language not in ENGLISH:
        raise BadRequest(f"language {language!r} is not supported: the served model "
                         "transcribes English ('en')", param="language")
    try:
        temperature = float(str(form.get("temperature") or 0.0))
    except ValueError:
        raise BadRequest("temperature must be a number", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise BadRequest(f"temperature {temperature} is outside 0..1", param="temperature")
    granularities = tuple(str(g) for g in form.getlist("timestamp_granularities[]"))
    for granularity in granularities:
        if granularity not in ("word", "segment"):
            raise BadRequest(f"timestamp granularity {granularity!r}: use 'word' or 'segment'",
                             param="timestamp_granularities[]")
    if granularities and response_format != "verbose_json":
        raise BadRequest("timestamp_granularities[] needs response_format=verbose_json",
                         param="timestamp_granularities[]")
    stream = str(form.get("stream") or "false").lower()
    if stream not in ("true", "false"):
        raise BadRequest(f"stream must be true or false, got {stream!r}", param="stream")
    if stream == "true" and response_format not in ("json", "text"):
        raise BadRequest("stream=true sends transcript.text events; response_format must be "
                         "json or text", param="stream")
    return TranscriptionParams(response_format, "en", temperature, stream == "true",
                               granularities)


def decode_upload(upload: object) -> np.ndarray:
    """The uploaded file as 16 kHz mono float32 (runs in a worker thread).

    Raises:
        BadRequest: no file, an empty file, or one libsndfile cannot decode.
    """
    if not isinstance(upload, UploadFile):
        raise BadRequest("'file' is required: the audio as a multipart file", param="file")
    data = upload.file.read()
    name = upload.filename or "upload"
    if not data:
        raise BadRequest(f"the file {name!r} is empty (0 bytes)", param="file")
    suffix = Path(name).suffix[:16]
    with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as tmp:
        tmp.write(data)
    try:
        samples = read_audio(tmp.name)
    except ValueError as exc:
        raise BadRequest(f"the file {name!r} is not audio oasr can decode (wav, flac, ogg, "
                         f"mp3 and what else libsndfile reads): {exc}", param="file") from None
    finally:
        os.unlink(tmp.name)
    if not np.isfinite(samples).all():
        raise BadRequest(f"the file {name!r} holds NaN or infinite samples", param="file")
    return samples


async def _answer(engine: EngineThread, samples: np.ndarray,
                  params: TranscriptionParams) -> Response:
    stream = EngineStream(engine, MODEL_SAMPLE_RATE, "f32le")
    first = await stream.next_event()  # ready, or busy when no slot freed in time
    if is_busy(first):
        raise BadRequest(f"the server is busy: {first.message}; retry later", status=503,
                         code="busy")
    feeder = asyncio.create_task(feed_paced(stream, samples, MODEL_SAMPLE_RATE, MAX_AHEAD_S))
    duration_s = len(samples) / MODEL_SAMPLE_RATE
    if params.stream:
        return StreamingResponse(_sse(stream, feeder), media_type="text/event-stream")
    try:
        segments = [s async for s in _segments(stream)]
    finally:
        await _finish(stream, feeder)
    return _format(segments, duration_s, params)


async def _segments(stream: EngineStream) -> AsyncIterator[fmt.Segment]:
    """The stream's finals until its done; an engine error is a 500 for this request."""
    while True:
        event = await stream.next_event()
        match event:
            case Final():
                yield fmt.Segment(event.text, event.start, event.end, event.ctc_words)
            case Error():
                raise BadRequest(f"transcription failed: {event.code}: {event.message}",
                                 status=500, code=event.code)
            case Done():
                return


async def _sse(stream: EngineStream, feeder: asyncio.Task[None]) -> AsyncIterator[bytes]:
    texts: list[str] = []
    try:
        async for segment in _segments(stream):
            if segment.text:
                yield fmt.sse(fmt.delta_event((" " if texts else "") + segment.text,
                                              len(texts)))
                texts.append(segment.text)
        yield fmt.sse(fmt.done_event(" ".join(texts)))
    except BadRequest as error:
        yield fmt.sse(openai_error(error.message, "server_error", error.code))
    finally:
        await _finish(stream, feeder)


async def _finish(stream: EngineStream, feeder: asyncio.Task[None]) -> None:
    stream.close()
    feeder.cancel()
    with contextlib.suppress(asyncio.CancelledError, ValueError):  # ValueError: stream closed
        await feeder


def _format(segments: list[fmt.Segment], duration_s: float,
            params: TranscriptionParams) -> Response:
    kind = params.response_format
    if kind == "text":
        return PlainTextResponse(fmt.transcript_text(segments) + "\n")
    if kind == "srt":
        return PlainTextResponse(fmt.to_srt(segments))
    if kind == "vtt":
        return PlainTextResponse(fmt.to_vtt(segments), media_type="text/vtt")
    body: dict[str, Any]
    if kind == "verbose_json":
        body = fmt.to_verbose_json(segments, duration_s, params.language, 0.0,
                                   params.granularities)
    else:
        body = fmt.to_json(segments, duration_s)
    return JSONResponse(body)


async def models(request: Request) -> Response:
    """The served model, under the name of its family (any name is accepted on requests)."""
    context = request.app.state.context
    if context.engine is None:
        raise_not_ready = BadRequest("the engine is not ready yet", status=503, code="not_ready")
        return raise_not_ready.response()
    family = context.engine.engine.family.name.replace("_", "-")
    return JSONResponse({"object": "list", "data": [
        {"id": f"oasr-{family}", "object": "model", "created": int(context.started_at),
         "owned_by": "oasr"}]})
