"""OpenAI's HTTP transcription API: ``POST /v1/audio/transcriptions`` and ``GET /v1/models``.

An uploaded file becomes one stream of the same engine the live sockets use (its own slot,
batched with them): its header is checked first (`backend.upload_audio`: sample rate, and
duration against ``--max-upload-audio``), then it is decoded a block at a time on a worker
thread and fed at its own rate, a little ahead of decoding (the engine stream resamples it as
it does a live client's); the answer comes once the stream's ``done`` has followed its last
final, so every segment carries the second pass's text when it ran. A client that leaves
before its answer cancels the request: its stream is aborted at once (`ClientWatch`).

Accepted and documented as such: ``model`` (any name), ``prompt`` (as OpenAI's: the text
Whisper's second pass is prompted with, before the hotwords), ``hotwords`` (oasr's: terms both
passes are biased towards, comma-separated or a JSON list of phrases and ``{"phrase", "boost"}``
objects; `oasr.decoding.context`), ``temperature`` (0..1, ignored: decoding is greedy),
``language`` (``en`` only: the served models are English), ``timestamp_granularities[]``
``segment`` and ``word`` (with ``verbose_json``; times from the CTC pass, see
``openai_formats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from starlette.background import BackgroundTask
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from backend import openai_formats as fmt
from backend.auth import openai_error
from backend.engine_stream import EngineStream, feed_blocks, is_busy
from backend.upload_audio import UploadAudio, UploadRefused
from oasr.decoding.context import (
    MAX_PROMPT_CHARS,
    Hotword,
    HotwordError,
    parse_hotwords,
    split_terms,
)
from oasr.engine import EngineThread
from oasr.engine.events import Done, Error, Final

FORM_FIELDS = frozenset({"file", "model", "language", "prompt", "response_format",
                         "temperature", "timestamp_granularities[]", "stream", "hotwords"})
MAX_AHEAD_S = 10.0  # audio fed ahead of decoding; well under the engine's pending limit
ENGLISH = ("en", "english")
CLIENT_CLOSED_REQUEST = 499  # the status a request whose client left "gets" (nobody reads it)
logger = logging.getLogger(__name__)
T = TypeVar("T")


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
    prompt: str = ""
    hotwords: tuple[Hotword, ...] = ()


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


class ClientLeft(Exception):
    """The client closed its connection before its answer."""


class ClosingStreamingResponse(StreamingResponse):
    """A `StreamingResponse` whose body generator is closed however the response ends.

    When the client has gone, Starlette's response stops at the failed send (it raises
    ``ClientDisconnect`` before its background task) and leaves the generator suspended for
    the garbage collector. The generator's ``finally`` (the upload's decoder and temporary
    file closed, the stream aborted) then ran whenever a collection found it, by which time
    the collector could have closed the file under the decoder. Closing it here runs that
    cleanup at once, in order."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


class ClientWatch:
    """Notices a client leaving once its request body has been read.

    From then on uvicorn's ``receive()`` only answers ``http.disconnect``, when the connection
    closes (or the response is complete); `run` cancels the work it was given then.
    """

    def __init__(self, receive: Receive) -> None:
        self.left = asyncio.Event()
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left.set()

    async def run(self, work: Awaitable[T]) -> T:
        """``work``'s result; cancels it and raises `ClientLeft` if the client leaves first."""
        task = asyncio.ensure_future(work)
        left = asyncio.ensure_future(self.left.wait())
        try:
            await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not task.done():
                task.cancel()  # its finally blocks abort the stream
        if task.done() and not task.cancelled():
            return task.result()
        await asyncio.wait({task})  # let the cancelled work clean up
        raise ClientLeft

    def stop(self) -> None:
        self._task.cancel()


class Upload:
    """The parsed form and its opened audio; `close` (idempotent) frees both, the decoder first
    (it waits for a block still being read on a worker thread)."""

    def __init__(self, form: FormData) -> None:
        self.form = form
        self.audio: UploadAudio | None = None

    async def close(self) -> None:
        audio, self.audio = self.audio, None
        if audio is not None:
            await asyncio.to_thread(audio.close)
        await self.form.close()


async def transcriptions(request: Request) -> Response:
    context = request.app.state.context
    limit = context.config.max_upload_bytes
    try:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise too_large(limit)
        limited = Request(request.scope, limited_receive(request.receive, limit))
        try:
            form = await limited.form(max_files=1, max_fields=len(FORM_FIELDS) + 4)
        except HTTPException as exc:
            raise BadRequest(f"the multipart form could not be read: {exc.detail}") from None
        except ClientDisconnect:  # not an error of ours: nothing to answer, nothing to log
            logger.info("POST /v1/audio/transcriptions: the client left during its upload")
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        upload = Upload(form)
        owned = False  # a streamed answer closes the upload when its stream ends
        try:
            params = parse_params(form)
            upload.audio = await asyncio.to_thread(
                open_upload, form.get("file"), context.config.max_upload_audio_s)
            if context.engine is None or not context.is_ready:
                raise BadRequest("the engine is not ready yet", status=503, code="not_ready")
            watch = ClientWatch(request.receive)
            try:
                response = await watch.run(_answer(context.engine, upload, params))
            except ClientLeft:
                logger.info("POST /v1/audio/transcriptions: the client left; its stream was "
                            "aborted")
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            finally:
                watch.stop()
            owned = isinstance(response, StreamingResponse)
            return response
        finally:
            if not owned:
                await upload.close()
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
    prompt = str(form.get("prompt") or "")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadRequest(f"prompt of {len(prompt)} characters; at most {MAX_PROMPT_CHARS}",
                         param="prompt")
    return TranscriptionParams(response_format, "en", temperature, stream == "true",
                               granularities, prompt, form_hotwords(form.get("hotwords")))


def form_hotwords(value: object) -> tuple[Hotword, ...]:
    """The ``hotwords`` form field: a JSON list (phrases, ``{"phrase", "boost"}`` objects)
    or comma-separated phrases.

    Raises:
        BadRequest: not JSON where it looks like it, or a term the limits refuse.
    """
    if value is None:
        return ()
    if not isinstance(value, str):
        raise BadRequest("hotwords must be a text field", param="hotwords")
    try:
        if value.lstrip().startswith("["):
            try:
                terms: object = json.loads(value)
            except ValueError as exc:
                raise BadRequest(f"hotwords is not a JSON list: {exc}", param="hotwords") from None
        else:
            terms = split_terms(value)
        return parse_hotwords(terms)
    except HotwordError as exc:
        raise BadRequest(str(exc), param="hotwords", code="bad_hotwords") from None


def open_upload(upload: object, max_duration_s: float) -> UploadAudio:
    """The uploaded file, opened and checked from its header (runs in a worker thread).

    Raises:
        BadRequest: no file, an empty file, one libsndfile cannot decode, a sample rate out of
            range (400) or more than ``max_duration_s`` of audio (413).
    """
    if not isinstance(upload, UploadFile):
        raise BadRequest("'file' is required: the audio as a multipart file", param="file")
    name = upload.filename or "upload"
    if not upload.size:
        raise BadRequest(f"the file {name!r} is empty (0 bytes)", param="file")
    upload.file.seek(0)
    try:
        return UploadAudio.open(upload.file, name, max_duration_s)
    except UploadRefused as refused:
        raise _bad_file(refused) from None


def _bad_file(refused: UploadRefused) -> BadRequest:
    return BadRequest(refused.message, param="file", status=refused.status, code=refused.code)


async def _answer(engine: EngineThread, upload: Upload, params: TranscriptionParams) -> Response:
    audio = upload.audio
    assert audio is not None
    try:  # spelled in the served model's units: a term it cannot write is this request's 400
        hotwords = engine.hotwords(params.hotwords, params.prompt)
    except HotwordError as exc:
        raise BadRequest(str(exc), param="hotwords", code="bad_hotwords") from None
    stream = EngineStream(engine, audio.sample_rate, "f32le", hotwords=hotwords or None)
    feeder: asyncio.Task[None] | None = None
    try:
        first = await stream.next_event()  # ready, or busy when no slot freed in time
        if is_busy(first):
            raise BadRequest(f"the server is busy: {first.message}; retry later", status=503,
                             code="busy")
        feeder = asyncio.create_task(_feed(stream, audio))
        if params.stream:
            async def finish() -> None:  # after the stream's last event, or if it never ran
                # a client that leaves cancels the response's task group (ASGI 2.3), and with
                # it every await of this cleanup: shielded, the feeder is stopped and the file
                # closed after the decoder, never left to the garbage collector
                with anyio.CancelScope(shield=True):
                    await _finish(stream, feeder)
                    await upload.close()

            return ClosingStreamingResponse(_sse(stream, finish), media_type="text/event-stream",
                                            background=BackgroundTask(finish))
        segments = [s async for s in _segments(stream)]
    except BaseException:
        await _finish(stream, feeder)
        raise
    await _finish(stream, feeder)
    return _format(segments, audio.duration_s, params)


async def _feed(stream: EngineStream, audio: UploadAudio) -> None:
    """Feed the file; bad audio further in fails the stream with the client's 400."""
    try:
        await feed_blocks(stream, audio.read_block, audio.sample_rate, MAX_AHEAD_S)
    except UploadRefused as refused:
        stream.fail(_bad_file(refused))
    except ValueError as exc:  # samples the engine refuses (float PCM beyond +-2.0)
        stream.fail(BadRequest(f"the file {audio.name!r} holds audio oasr cannot use: {exc}",
                               param="file"))


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


async def _sse(stream: EngineStream, finish: Any) -> AsyncIterator[bytes]:
    texts: list[str] = []
    try:
        async for segment in _segments(stream):
            if segment.text:
                yield fmt.sse(fmt.delta_event((" " if texts else "") + segment.text,
                                              len(texts)))
                texts.append(segment.text)
        yield fmt.sse(fmt.done_event(" ".join(texts)))
    except BadRequest as error:
        error_type = "invalid_request_error" if error.status < 500 else "server_error"
        yield fmt.sse(openai_error(error.message, error_type, error.code, error.param))
    finally:
        await finish()


async def _finish(stream: EngineStream, feeder: asyncio.Task[None] | None) -> None:
    """Abort the stream unless it finished, and stop feeding it (idempotent)."""
    stream.close()
    if feeder is not None:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
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
