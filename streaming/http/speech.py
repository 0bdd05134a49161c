"""POST /v1/audio/speech: text spoken by the loaded voice, one synthesis window per engine step, streamed as it is
made (wav, pcm) or encoded at the end (flac, mp3, opus), as audio bytes or speech.audio.delta events."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from speechrt.errors import UserError

from ..realtime.protocol import ProtocolError, check_voice
from .endpoint import SSE, RestError, check_model, engine_stream, json_body, loaded, number, sse

log = logging.getLogger(__name__)

# OpenAI's model names, accepted for the loaded voice (its voice names: protocol.check_voice)
TTS_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")  # the first two streamed, the others encoded at the end
ENCODED_MEDIA = {"flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus"}
MAX_SPEECH_CHARS = 4096


class Speech:
    """The speech endpoint of one SpeechServer."""

    def __init__(self, server):
        self.server = server

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
        chunks = engine_stream(self.server, speech_chunks(tts, text, speed, speaker, first_audio))
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
