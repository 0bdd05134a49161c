"""POST /v1/audio/transcriptions and /v1/audio/translations: an uploaded file transcribed long-form, one 30-s window
per engine step (ASRPipeline.transcribe_steps), whole or streamed (transcript.text.delta events), in OpenAI's
response formats."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

import numpy as np
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from speechrt.pipelines import formats
from speechrt.pipelines.asr import segment_windows

from ..asr_options import rest_options
from .endpoint import SSE, RestError, check_model, engine_stream, number, sse

GRANULARITIES = ("segment", "word")


class Transcriptions:
    """The transcription endpoints of one SpeechServer."""

    def __init__(self, server):
        self.server = server
        self.o = server.options

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
        check_model(form.get("model"), "asr", self.server, "transcription")
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
        async with contextlib.aclosing(engine_stream(self.server, gen, "asr")) as steps:
            async for _, transcript in steps:
                if transcript is not None:
                    break
            else:
                raise RuntimeError("the transcription ended without a transcript")
        body = formats.render(transcript, fmt, task)
        if logprobs:  # one more encoder and decoder pass, on the engine's worker
            async with contextlib.aclosing(
                engine_stream(self.server, token_logprobs(asr, audio, transcript, opts), "asr")
            ) as step:
                async for lps in step:
                    if lps is not None:
                        body = json.dumps({**json.loads(body), "logprobs": lps}, ensure_ascii=False)
        return Response(body, media_type=formats.MEDIA_TYPES[fmt], headers={"Cache-Control": "no-store"})

    async def transcript_events(self, gen):
        first = True
        async with contextlib.aclosing(engine_stream(self.server, gen, "asr")) as steps:
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


def decode_audio(data: bytes, name: str | None) -> np.ndarray:
    """An uploaded file's bytes (anything libsndfile reads, else what PyAV's ffmpeg reads: AAC, M4A, MP4, WebM, as
    OpenAI's endpoint takes) -> float32 mono at 16 kHz."""
    from speechrt.models.audio import AudioError, load_audio, read_audio_file

    what = f"the file {name!r}" if name else "the uploaded file"
    try:
        pcm, rate = read_audio_file(io.BytesIO(data), what)
    except AudioError as e:
        raise RestError(400, str(e), "invalid_file") from None
    if pcm.shape[0] == 0:
        raise RestError(400, f"{what} holds no audio samples", "empty_file")
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
