"""POST /v1/audio/speech: text spoken by the loaded voice, one synthesis window per engine step, in any of OpenAI's
formats (mp3 by default, opus and aac encoded chunk by chunk on the engine's worker, wav and pcm, all streamed as they
are made; flac encoded at the end), as audio bytes or speech.audio.delta events."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
from fastapi import Request
from starlette.responses import StreamingResponse

from speechrt.errors import UserError

from ..realtime.protocol import ProtocolError, check_voice
from .endpoint import SSE, RestError, check_model, engine_stream, json_body, loaded, number, sse

log = logging.getLogger(__name__)

SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's; mp3 its default
PCM_RATE = 24000  # OpenAI's pcm: raw 16-bit little-endian mono at 24 kHz (no header to say another rate)
MAX_SPEECH_CHARS = 4096


class Speech:
    """The speech endpoint of one SpeechServer."""

    def __init__(self, server):
        self.server = server

    async def speech(self, request: Request):
        tts = loaded(self.server.tts, "voice")
        body = await json_body(request)
        check_model(body.get("model"), "tts", self.server, "speech")
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
        fmt = speech_format(body.get("response_format") or "mp3")
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
        out = SpeechOutput(fmt, tts.sample_rate)
        chunks = engine_stream(self.server, speech_chunks(tts, text, speed, speaker, out), "tts")
        try:  # the first chunk (or the error that the text cannot be read) before any byte is sent
            first = await anext(chunks)
        except StopAsyncIteration:
            raise RestError(400, "'input' holds nothing the voice can read") from None
        except UserError as e:
            raise RestError(400, f"'input' cannot be spoken: {e}") from None
        headers = {"Cache-Control": "no-store", "X-Sample-Rate": str(out.rate)}
        if stream_format == "sse":
            return StreamingResponse(
                speech_events(first, chunks, out, len(text)), media_type="text/event-stream", headers=SSE
            )
        return StreamingResponse(audio_stream(first, chunks, out), media_type=out.media_type, headers=headers)


class SpeechOutput:
    """The response's audio format: `fmt` (SPEECH_FORMATS) of a voice at `voice_rate` -> its sample rate, media type,
    the header a stream begins with, and the encoder of its chunks (`encode`, on the engine's worker)."""

    def __init__(self, fmt: str, voice_rate: int):
        from speechrt.pipelines.audio_codecs import CODECS, codec_rate

        self.fmt, self.voice_rate = fmt, voice_rate
        if fmt in CODECS:
            self.rate, self.media_type = codec_rate(fmt, voice_rate), CODECS[fmt][4]
        elif fmt == "pcm":
            self.rate, self.media_type = PCM_RATE, f"audio/pcm;rate={PCM_RATE};encoding=signed-int;bits=16"
        else:
            self.rate, self.media_type = voice_rate, "audio/wav"

    def header(self) -> bytes:
        """wav: a header whose sizes say 'unknown length', as OpenAI's streamed WAV; the others none."""
        from speechrt.pipelines.tts import wav_header

        return wav_header(self.rate, None) if self.fmt == "wav" else b""

    def encode(self, pcm_chunks):
        """The synthesized chunks (float32 at the voice's rate, or pcm16 bytes at self.rate for wav and pcm) -> the
        response's bytes, with the number of samples each holds (encoders may hold bytes back: b'' then)."""
        if self.fmt in ("wav", "pcm"):
            for c in pcm_chunks:
                yield c, len(c) // 2
            return
        from speechrt.pipelines.audio_codecs import STREAMS, StreamEncoder, encode_audio

        if self.fmt not in STREAMS:  # FLAC: whole at the end, its header then says its length (libsndfile needs it)
            chunks = []
            for c in pcm_chunks:  # (one synthesis window per engine step still)
                chunks.append(np.asarray(c, np.float32))
                yield b"", len(c)
            whole = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            yield encode_audio(whole, self.voice_rate, self.fmt)[0], 0
            return
        enc = StreamEncoder(self.fmt, self.voice_rate)
        for c in pcm_chunks:
            yield enc.feed(c), len(c)
        yield enc.flush(), 0


def speech_chunks(tts, text: str, speed: float, speaker, out: SpeechOutput):
    """On the engine's worker: the response's bytes and their samples, one synthesis window per step (the text is
    read on the first), encoded as `out` says."""
    raw = out.fmt in ("wav", "pcm")
    yield from out.encode(
        tts.synthesize(
            text,
            format="pcm16" if raw else "f32",
            sample_rate=out.rate if out.fmt == "pcm" else None,
            rate=speed,
            speaker=speaker,
            on_unsupported="drop",
            first_audio=out.fmt != "flac",  # audio sent at its end is not heard while it is made: for throughput
        )
    )


def speech_format(fmt) -> str:
    """The speech endpoint's response_format, if this server can write it; else a RestError naming the valid ones
    (or what to install, where PyAV is missing)."""
    if fmt not in SPEECH_FORMATS:
        raise RestError(
            400,
            f"response_format {fmt!r} is not supported; valid: {', '.join(SPEECH_FORMATS)} (all streamed as they "
            "are synthesized; mp3 the default)",
        )
    if fmt not in ("wav", "pcm"):
        from speechrt.pipelines.tts import check_encoding

        try:
            check_encoding(fmt)
        except UserError as e:
            raise RestError(400, str(e)) from None
    return fmt


async def speech_events(first, rest, out: SpeechOutput, chars: int):
    """stream_format=sse: speech.audio.delta events (base64 audio in the response's format as it is made; wav's
    streamed header first), then speech.audio.done with usage (speechrt counts the input's characters in, the audio's
    samples out); a failure part-way is an error event."""
    import base64

    def delta(data: bytes) -> str:
        return sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})

    samples = 0
    try:
        if header := out.header():
            yield delta(header)
        async for data, n in _chunks(first, rest):
            samples += n
            if data:
                yield delta(data)
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


async def audio_stream(first, rest, out: SpeechOutput):
    if header := out.header():
        yield header
    async for data, _ in _chunks(first, rest):
        if data:
            yield data


async def _chunks(first, rest):
    yield first
    async with contextlib.aclosing(rest):
        async for chunk in rest:
            yield chunk
