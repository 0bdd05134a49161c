"""OpenAI-compatible REST endpoints on the server's port, served by the same engine under the same key:
POST /v1/audio/transcriptions, /v1/audio/translations, /v1/audio/speech, /v1/chat/completions, GET
/v1/models. Transcription runs long-form one 30-s window per engine step (engine.stream over
ASRPipeline.transcribe_steps), speech one synthesis window per step, chat completions join the language
model's continuous batch: a REST request takes turns with the Realtime sessions instead of holding the
engine. At most `max_rest_requests` run at once (429 past that); uploads over `max_upload_bytes` get 413."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging

import numpy as np
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from speechrt.errors import UserError
from speechrt.pipelines import formats
from speechrt.pipelines.asr import segment_windows

from .asr_options import rest_options
from .engine import EngineStalled
from .http import authorized, json_error
from .realtime.protocol import ProtocolError, check_voice

log = logging.getLogger(__name__)

ROUTES = (
    "POST /v1/audio/transcriptions",
    "POST /v1/audio/translations",
    "POST /v1/audio/speech",
    "POST /v1/chat/completions",
    "GET /v1/models",
)
# OpenAI's model names, accepted for the loaded model so that code written for OpenAI runs as is (its voice
# names: protocol.check_voice)
ASR_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
TTS_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")  # the first two streamed, the others encoded at the end
ENCODED_MEDIA = {"flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus"}
MAX_SPEECH_CHARS = 4096
GRANULARITIES = ("segment", "word")
SSE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class RestError(Exception):
    """A request the endpoint refuses: an HTTP status and a message that says what is wrong and what is valid."""

    def __init__(self, status: int, message: str, code: str = "invalid_value", type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code, self.type = status, code, type_

    def response(self) -> JSONResponse:
        return json_error(self.status, str(self), self.code, self.type)


class Guarded(Response):
    """A response that gives the request's admission slot back once it has been sent, or the client has
    gone (streamed bodies hold the slot while they stream)."""

    def __init__(self, inner: Response, release):
        self.inner, self.release = inner, release
        self.status_code, self.background = inner.status_code, None

    async def __call__(self, scope, receive, send):
        try:
            await self.inner(scope, receive, send)
        finally:
            self.release()
            body = getattr(self.inner, "body_iterator", None)
            if hasattr(body, "aclose"):
                await body.aclose()  # a client that left: the engine work behind the stream stops


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False) if not isinstance(obj, str) else obj}\n\n"


def check_model(name, valid: list[str], what: str) -> None:
    if not name:
        raise RestError(
            400, f"'model' is required; {what} models here: {', '.join(valid)}", "missing_required_parameter"
        )
    if name not in valid:
        raise RestError(404, f"model {name!r} is not served here; {what} models: {', '.join(valid)}", "model_not_found")


def loaded(model, what: str):
    """`model` (a pipeline of the server), or a 404 saying the server loads no such model."""
    if model is None:
        raise RestError(
            404, f"this server loads no {what} (it was started with --transcription-only)", "model_not_found"
        )
    return model


def number(value, name: str, lo: float, hi: float, default):
    if value is None or value == "":
        return default
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise RestError(400, f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}") from None
    if not lo <= x <= hi:
        raise RestError(400, f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")
    return x


class RestAPI:
    """The endpoints of one SpeechServer; `register(app)` adds their routes."""

    def __init__(self, server):
        self.server = server
        self.o = server.options
        self.active = 0

    # -- admission -------------------------------------------------------------------------------------
    async def serve(self, request: Request, endpoint: str, handler) -> Response:
        s, c = self.server, self.server.counters
        c.rest_requests[endpoint] += 1
        if not authorized(request.headers, self.o.api_key):
            c.auth_failures += 1
            return json_error(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key")
        if s.shutting_down:
            return json_error(503, "the server is shutting down", "server_shutting_down", "server_error")
        if self.active >= self.o.max_rest_requests:
            c.rest_rejected += 1
            return json_error(
                429,
                f"the server is busy: {self.o.max_rest_requests} REST requests at most at once "
                "(--max-rest-requests); try again later",
                "rate_limit_exceeded",
                "rate_limit_error",
            )
        self.active += 1
        released = False

        def release():
            nonlocal released
            if not released:
                released = True
                self.active -= 1

        try:
            response = await handler(request)
        except RestError as e:
            response = e.response()
        except UserError as e:
            response = json_error(400, str(e), "invalid_value")
        except EngineStalled as e:
            c.stalls += 1
            response = json_error(503, f"the request failed: {e}", "engine_stalled", "server_error")
        except Exception as e:  # noqa: BLE001 - one request's failure is its own; the server goes on
            log.exception("%s failed", endpoint)
            response = json_error(500, f"the request failed: {type(e).__name__}: {e}", "server_error", "server_error")
        if response.status_code >= 400:
            c.rest_errors += 1
        if isinstance(response, StreamingResponse):
            return Guarded(response, release)
        release()
        return response

    async def run_stream(self, gen):
        """Items of generator `gen` run on the engine's worker one step each; the engine task stops if the
        consumer does."""
        eng = self.server.engine
        task, q = eng.stream(gen)
        try:
            while True:
                item = await eng.wait(q.get(), self.o.stall_timeout)
                if isinstance(item, StopAsyncIteration):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            task.cancelled = True

    # -- transcription -----------------------------------------------------------------------------------
    async def read_upload(self, request: Request):
        """The form of a multipart upload and its audio (float32 mono at 16 kHz)."""
        limit = self.o.max_upload_bytes
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit + (64 << 10):
            raise RestError(
                413,
                f"the upload is {int(size)} bytes; at most {limit} bytes are accepted (--max-upload-bytes)",
                "file_too_large",
            )
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise RestError(
                400,
                f"send the audio as multipart/form-data with a 'file' field (got content type {ctype or 'none'!r})",
                "invalid_request",
            )
        form = await request.form(max_files=1, max_fields=32)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise RestError(
                400, "no 'file' field: send the audio file as the multipart field 'file'", "missing_required_parameter"
            )
        data = await upload.read()
        if len(data) > limit:
            raise RestError(
                413,
                f"the file is {len(data)} bytes; at most {limit} bytes are accepted (--max-upload-bytes)",
                "file_too_large",
            )
        if not data:
            raise RestError(400, f"the file {upload.filename!r} is empty", "empty_file")
        return form, await asyncio.to_thread(decode_audio, data, upload.filename)

    async def transcriptions(self, request: Request, task: str = "transcribe"):
        asr = self.server.asr
        form, audio = await self.read_upload(request)
        check_model(form.get("model"), [asr.name, *ASR_ALIASES], "transcription")
        fmt = form.get("response_format") or "json"
        if fmt not in formats.FORMATS:
            raise RestError(400, f"response_format {fmt!r} is not supported; valid: {', '.join(formats.FORMATS)}")
        grains = form.getlist("timestamp_granularities[]") or form.getlist("timestamp_granularities")
        if any(g not in GRANULARITIES for g in grains):
            raise RestError(400, f"timestamp_granularities {grains} has unknown values; valid: segment, word")
        if grains and fmt != "verbose_json":  # as OpenAI's: the times go in verbose_json's segments and words
            raise RestError(
                400,
                f"timestamp_granularities need response_format verbose_json (got {fmt!r}): the "
                "other formats have no place for word times",
            )
        t = number(form.get("temperature"), "temperature", 0, 1, None)
        opts = rest_options(task, form.get("language") or None, form.get("prompt") or None, t)
        if "word" in grains:  # a backend without cross-attention weights refuses it (a 400 naming those with them)
            opts["word_timestamps"] = True
        vad = form.get("vad_filter")  # speechrt's extension (faster-whisper's vad_filter): decode only speech
        if vad not in (None, "", "true", "True", "1", "false", "False", "0"):
            raise RestError(400, f"vad_filter {vad!r} is not a boolean; valid: true, false")
        opts["vad_filter"] = vad in ("true", "True", "1")
        stream = form.get("stream") in ("true", "True", "1")
        if stream and fmt not in ("json", "text"):
            raise RestError(
                400,
                f"stream=true sends transcript.text.delta events: response_format must be json or "
                f"text with it, got {fmt!r}",
            )
        logprobs = check_include(form.getlist("include[]") or form.getlist("include"), fmt, stream)
        options = asr.options(**opts)
        gen = transcription_steps(asr, audio, options)
        if stream:
            return StreamingResponse(self.transcript_events(gen), media_type="text/event-stream", headers=SSE)
        async with contextlib.aclosing(self.run_stream(gen)) as steps:
            async for _, transcript in steps:
                if transcript is not None:
                    break
            else:
                raise RuntimeError("the transcription ended without a transcript")
        body = formats.render(transcript, fmt, task)
        if logprobs:  # one more encoder and decoder pass, on the engine's worker
            async with contextlib.aclosing(self.run_stream(token_logprobs(asr, audio, transcript, opts))) as step:
                async for lps in step:
                    if lps is not None:
                        body = json.dumps({**json.loads(body), "logprobs": lps}, ensure_ascii=False)
        return Response(body, media_type=formats.MEDIA_TYPES[fmt], headers={"Cache-Control": "no-store"})

    async def transcript_events(self, gen):
        first = True
        async with contextlib.aclosing(self.run_stream(gen)) as steps:
            async for segments, transcript in steps:
                for seg in segments:
                    text = seg.text.lstrip() if first else seg.text
                    if text:
                        first = False
                        yield sse({"type": "transcript.text.delta", "delta": text})
                if transcript is not None:
                    yield sse({"type": "transcript.text.done", "text": transcript.text})

    async def translations(self, request: Request):
        return await self.transcriptions(request, task="translate")

    # -- speech ----------------------------------------------------------------------------------------
    async def speech(self, request: Request):
        tts = loaded(self.server.tts, "voice")
        body = await json_body(request)
        check_model(body.get("model"), [tts.name, *TTS_ALIASES], "speech")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise RestError(400, "'input' must be a non-empty string: the text to speak", "missing_required_parameter")
        if len(text) > MAX_SPEECH_CHARS:
            raise RestError(400, f"'input' is {len(text)} characters; at most {MAX_SPEECH_CHARS}")
        voice = body.get("voice")
        if isinstance(voice, dict):
            voice = voice.get("id")
        if voice is not None:  # the loaded voice, its speakers by name, or OpenAI's names (the loaded voice)
            try:
                voice = check_voice(voice, {"tts": [tts.name, *tts.voice.speaker_id_map]}, "voice")
            except ProtocolError as e:
                raise RestError(400, str(e), e.code) from None
        fmt = speech_format(body.get("response_format") or "wav")
        stream_format = body.get("stream_format") or "audio"
        if stream_format not in ("audio", "sse"):
            raise RestError(
                400,
                f"stream_format must be 'audio' (the audio bytes, streamed as they are made) or 'sse' "
                f"(speech.audio.delta events), got {stream_format!r}",
            )
        if body.get("instructions"):
            raise RestError(
                400, "instructions (how to speak) are not supported: the voice reads the input as it is; leave them out"
            )
        speed = number(body.get("speed"), "speed", 0.25, 4.0, 1.0)
        speaker = voice if voice in tts.voice.speaker_id_map else None
        # audio encoded at its end is not heard while it is made: every sentence for throughput
        first_audio = stream_format == "sse" or fmt not in ENCODED_MEDIA
        chunks = self.run_stream(speech_chunks(tts, text, speed, speaker, first_audio))
        try:  # the first chunk (or the error that the text cannot be read) before any byte is sent
            first = await anext(chunks)
        except StopAsyncIteration:
            raise RestError(400, "'input' holds nothing the voice can read") from None
        except UserError as e:
            raise RestError(400, f"'input' cannot be spoken: {e}") from None
        rate = tts.sample_rate
        headers = {"Cache-Control": "no-store", "X-Sample-Rate": str(rate)}
        if stream_format == "sse":
            return StreamingResponse(
                speech_events(first, chunks, fmt, rate, len(text)), media_type="text/event-stream", headers=SSE
            )
        if fmt in ENCODED_MEDIA:
            pcm16 = b"".join([c async for c in audio_stream(first, chunks, None)])
            encoded, out_rate = await encode_pcm16(pcm16, rate, fmt)
            headers["X-Sample-Rate"] = str(out_rate)
            return Response(encoded, media_type=ENCODED_MEDIA[fmt], headers=headers)
        media = "audio/wav" if fmt == "wav" else f"audio/pcm;rate={rate};encoding=signed-int;bits=16"
        return StreamingResponse(
            audio_stream(first, chunks, rate if fmt == "wav" else None), media_type=media, headers=headers
        )

    # -- chat ------------------------------------------------------------------------------------------
    async def chat(self, request: Request):
        from .rest_chat import ChatCompletion

        lm = loaded(self.server.lm, "language model")
        body = await json_body(request)
        check_model(body.get("model"), [lm.name], "chat")
        return await ChatCompletion(self.server, body).respond()

    # -- models ----------------------------------------------------------------------------------------
    def model_list(self) -> list[dict]:
        created = int(self.server.counters.started)
        names = [
            (f, p.name)
            for f, p in (("asr", self.server.asr), ("lm", self.server.lm), ("tts", self.server.tts))
            if p is not None
        ]
        return [{"id": n, "object": "model", "created": created, "owned_by": "speechrt", "family": f} for f, n in names]

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": self.model_list()})

    async def model(self, request: Request):
        name = request.path_params["model"]
        for m in self.model_list():
            if m["id"] == name:
                return JSONResponse(m)
        raise RestError(
            404,
            f"model {name!r} is not served here; models: {', '.join(m['id'] for m in self.model_list())}",
            "model_not_found",
        )

    def register(self, app: FastAPI) -> None:
        for path, method, handler in (
            ("/v1/audio/transcriptions", "POST", self.transcriptions),
            ("/v1/audio/translations", "POST", self.translations),
            ("/v1/audio/speech", "POST", self.speech),
            ("/v1/chat/completions", "POST", self.chat),
            ("/v1/models", "GET", self.models),
            ("/v1/models/{model}", "GET", self.model),
        ):
            app.add_api_route(path, self.route(path, handler), methods=[method], include_in_schema=False)

    def route(self, endpoint: str, handler):
        async def route(request: Request):
            return await self.serve(request, endpoint, handler)

        return route


async def json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise RestError(400, "the request body must be a JSON object", "invalid_json") from None
    if not isinstance(body, dict):
        raise RestError(400, "the request body must be a JSON object", "invalid_json")
    return body


def decode_audio(data: bytes, name: str | None) -> np.ndarray:
    """An uploaded file's bytes (anything libsndfile reads) -> float32 mono at 16 kHz."""
    import soundfile as sf

    from speechrt.models.audio import load_audio

    try:
        pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - libsndfile's errors for what it cannot read
        raise RestError(
            400,
            f"the file {name!r} is not a readable audio file ({e}); readable formats: WAV, FLAC, "
            "OGG (Vorbis/Opus), MP3, AIFF",
            "invalid_file",
        ) from None
    if pcm.shape[0] == 0:
        raise RestError(400, f"the file {name!r} holds no audio samples", "empty_file")
    return load_audio(pcm, source_rate=rate)


def transcription_steps(asr, audio: np.ndarray, opts):
    """On the engine's worker: one 30-s window per step, yielding (segments decoded in it, None), then
    ([], the Transcript)."""
    new = []
    steps = asr.transcribe_steps(audio, opts, on_segment=new.append)
    while True:
        try:
            next(steps)
        except StopIteration as end:
            yield list(new), end.value
            return
        yield list(new), None
        new.clear()


def check_include(include: list[str], fmt: str, stream: bool) -> bool:
    """A transcription's include[] -> whether it asks for logprobs (the one value known), or a RestError that
    says what the request must be for them."""
    if any(i != "logprobs" for i in include):
        raise RestError(400, f"include {include} has unknown values; valid: logprobs")
    if not include:
        return False
    if fmt != "json" or stream:
        raise RestError(400, "include[]=logprobs comes with response_format json, not streamed")
    return True


def token_logprobs(asr, audio: np.ndarray, transcript, opts: dict):
    """On the engine's worker, one step per 30-s span of the transcript's segments (segment_windows): the log
    probability of each text token of `transcript`, as OpenAI's logprobs: [{token, logprob, bytes}] (yielded
    last; None before, one per span)."""
    out = []
    for a, b, tokens in segment_windows(transcript.segments, len(audio)):
        _, lps = asr.align(audio[a:b], tokens, transcript.language, opts["task"])
        out += [{"token": t.decode("utf-8", "replace"), "logprob": round(lp, 6), "bytes": list(t)} for _, t, lp in lps]
        yield None
    yield out


def speech_chunks(tts, text: str, speed: float, speaker, first_audio: bool = True):
    """On the engine's worker: int16 bytes, one synthesis window per step (the text is read on the first)."""
    yield from tts.synthesize(
        text, format="pcm16", rate=speed, speaker=speaker, on_unsupported="drop", first_audio=first_audio
    )


def speech_format(fmt) -> str:
    """The speech endpoint's response_format, if this server can write it; else a RestError naming the valid ones
    (or what to install, where the libsndfile lacks MP3 or Opus)."""
    if fmt not in SPEECH_FORMATS:
        raise RestError(
            400,
            f"response_format {fmt!r} is not supported; valid: {', '.join(SPEECH_FORMATS)} (wav and "
            "pcm streamed as they are synthesized, the others encoded at the end)",
        )
    if fmt in ENCODED_MEDIA:
        from speechrt.pipelines.tts import check_encoding

        try:
            check_encoding(fmt)
        except UserError as e:
            raise RestError(400, str(e)) from None
    return fmt


async def encode_pcm16(pcm16: bytes, rate: int, fmt: str) -> tuple[bytes, int]:
    """Whole int16 speech -> the bytes of a `fmt` file and its rate (pipelines.tts.encode_audio), off the event
    loop: minutes of speech take LAME a second or more."""
    from speechrt.pipelines.tts import encode_audio

    return await asyncio.to_thread(encode_audio, np.frombuffer(pcm16, "<i2") / np.float32(32767.0), rate, fmt)


async def speech_events(first: bytes, rest, fmt: str, rate: int, chars: int):
    """stream_format=sse: speech.audio.delta events (base64 audio in `fmt`: wav and pcm as they are synthesized,
    the encoded formats whole at the end), then speech.audio.done with usage (speechrt counts the input's
    characters in, the audio's samples out); a failure part-way is an error event."""
    import base64

    from speechrt.pipelines.tts import wav_header

    def delta(data: bytes) -> str:
        return sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})

    samples, whole = 0, []
    try:
        if fmt == "wav":
            yield delta(wav_header(rate, None))
        async for chunk in audio_stream(first, rest, None):
            samples += len(chunk) // 2
            if fmt in ENCODED_MEDIA:
                whole.append(chunk)
            else:
                yield delta(chunk)
        if whole:
            yield delta((await encode_pcm16(b"".join(whole), rate, fmt))[0])
    except Exception as e:  # noqa: BLE001 - the status is sent: the error goes as an event
        log.exception("speech synthesis failed part-way")
        yield sse({"type": "error", "error": {"message": f"speech synthesis failed: {e}", "type": "server_error"}})
        return
    yield sse(
        {
            "type": "speech.audio.done",
            "usage": {"input_tokens": chars, "output_tokens": samples, "total_tokens": chars + samples},
        }
    )


async def audio_stream(first: bytes, rest, wav_rate: int | None):
    from speechrt.pipelines.tts import wav_header

    if wav_rate is not None:  # a stream: the sizes say 'unknown length', as OpenAI's streamed WAV does
        yield wav_header(wav_rate, None)
    yield first
    async with contextlib.aclosing(rest):
        async for chunk in rest:
            yield chunk
